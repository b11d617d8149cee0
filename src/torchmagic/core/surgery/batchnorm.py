"""BatchNorm policies for frozen blocks.

``eval`` (default, Keras): the layer runs in inference mode and its running statistics
stop moving, also after ``model.train()`` — a forward pre-hook puts it back in eval
before every call. ``train`` (fastai's ``train_bn``): left alone, and the weights and
biases of the normalization layers fastai names (BatchNorm, InstanceNorm, LayerNorm)
keep training. ``frozen`` (timm): BatchNorm2d is
swapped for torchvision's FrozenBatchNorm2d (other BatchNorm kinds, and layers without
running statistics, fall back to ``eval``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.hooks import RemovableHandle

from ..modules import is_batchnorm, is_frozen_batchnorm, parent_of
from ..registry import REGISTRY
from . import ties
from .selection import Selection
from .transaction import Transaction

# the layers whose weights fastai's train_bn keeps training in frozen groups
TRAINED_NORMS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.LayerNorm,
)


def trained_norms(selection: Selection) -> set[int]:
    """Ids of the selection's parameters that the ``train`` policy keeps training."""
    return {
        id(p)
        for m in selection.modules()
        if isinstance(m, TRAINED_NORMS)
        for p in m.parameters(recurse=False)
    }


def hold_in_eval(module: nn.Module, args: tuple) -> None:
    """Forward pre-hook: run this BatchNorm in inference mode whatever ``train()`` said."""
    module.training = False


def is_held(module: nn.Module) -> bool:
    return any(hook is hold_in_eval for hook in module._forward_pre_hooks.values())


def mode(module: nn.Module) -> str:
    """How a BatchNorm layer behaves: frozen, held (eval by policy), train or eval."""
    if is_frozen_batchnorm(module):
        return "frozen"
    if is_held(module):
        return "held"
    return "train" if module.training else "eval"


def _hold(bn: nn.Module, tx: Transaction) -> None:
    if is_held(bn):
        return
    was_training = bn.training
    handles: list[RemovableHandle] = []

    def inverse() -> None:
        for handle in handles:
            handle.remove()
        bn.training = was_training

    tx.add(inverse)
    handles.append(bn.register_forward_pre_hook(hold_in_eval))
    bn.training = False


def _release(bn: nn.Module, training: bool, tx: Transaction) -> None:
    hooks = bn._forward_pre_hooks
    held = [(k, h) for k, h in hooks.items() if h is hold_in_eval]
    tx.add(lambda: hooks.update(held))  # back under their keys (a re-run changes nothing)
    for key, _ in held:
        del hooks[key]
    tx.set_attr(bn, "training", training)


def _swap(root: nn.Module, name: str, new: nn.Module, tx: Transaction) -> None:
    parent, attr = parent_of(root, name)
    old = parent._modules[attr]
    assert old is not None  # a BatchNorm was found there
    tx.add(lambda: setattr(parent, attr, old))
    tx.hold([*old.parameters(), *old.buffers()])
    setattr(parent, attr, new)


_COPIED = ("running_mean", "running_var", "weight", "bias")


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """What a FrozenBatchNorm2d holds of a BatchNorm2d: its statistics, and its affine
    parameters when it has them."""
    return {n: t for n in _COPIED if isinstance(t := getattr(module, n, None), torch.Tensor)}


def _frozen_copy(bn: nn.BatchNorm2d) -> nn.Module:
    """A FrozenBatchNorm2d holding ``bn``'s values (torchvision imported here, on first use)."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    mine = _tensors(bn)
    ref = mine["running_mean"]
    frozen = FrozenBatchNorm2d(bn.num_features, eps=bn.eps).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        for name, tensor in mine.items():
            getattr(frozen, name).copy_(tensor)
    REGISTRY.batchnorm_originals[frozen] = bn  # unfreezing puts this one back
    frozen.original_settings = {"momentum": bn.momentum, "affine": bn.affine}  # copies keep it
    return frozen


def stands_in(module: nn.Module) -> bool:
    """A FrozenBatchNorm2d the ``frozen`` policy put in place of a BatchNorm2d (copies too)."""
    return is_frozen_batchnorm(module) and hasattr(module, "original_settings")


def plain_copy(frozen: nn.Module) -> nn.BatchNorm2d:
    """A new BatchNorm2d in eval mode with ``frozen``'s values and its original's settings
    (and batch count, when known): the module the model was built with, for an export
    under the plain architecture's keys. Nothing of the live model changes."""
    theirs = _tensors(frozen)
    ref = theirs["running_mean"]
    settings = getattr(frozen, "original_settings", {})
    bn = nn.BatchNorm2d(
        ref.numel(), eps=cast(float, frozen.eps), **settings, device=ref.device, dtype=ref.dtype
    )
    with torch.no_grad():
        for name, tensor in _tensors(bn).items():
            tensor.copy_(theirs[name])
        original = REGISTRY.batchnorm_originals.get(frozen)
        counted = None if original is None else original.num_batches_tracked
        if counted is not None and bn.num_batches_tracked is not None:
            bn.num_batches_tracked.copy_(counted)
    return bn.eval()


def _restored(frozen: nn.Module, training: bool, tx: Transaction) -> nn.BatchNorm2d:
    """The BatchNorm2d ``frozen`` replaced, holding ``frozen``'s current values (a checkpoint
    may have been loaded meanwhile), on its device and dtype; a new one with ``frozen``'s
    eps, momentum and affine when the original is unknown (the model was copied while
    frozen)."""
    theirs = _tensors(frozen)
    ref = theirs["running_mean"]
    bn = REGISTRY.batchnorm_originals.get(frozen)
    if bn is None:
        settings = getattr(frozen, "original_settings", {})
        bn = nn.BatchNorm2d(
            ref.numel(), eps=cast(float, frozen.eps), **settings, device=ref.device, dtype=ref.dtype
        )
    mine = _tensors(bn)
    old = mine["running_mean"]
    if old.device != ref.device or old.dtype != ref.dtype:
        device, dtype = old.device, old.dtype
        tx.add(lambda: bn.to(device=device, dtype=dtype))
        bn.to(device=ref.device, dtype=ref.dtype)
        mine = _tensors(bn)
    saved = [(tensor, tensor.detach().clone()) for tensor in mine.values()]

    def restore() -> None:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)

    tx.add(restore)
    tx.hold(value for _, value in saved)
    with torch.no_grad():
        for name, tensor in mine.items():
            tensor.copy_(theirs[name])
    tx.set_attr(bn, "training", training)
    return bn


def _named_batchnorms(selection: Selection) -> list[tuple[list[str], nn.Module]]:
    """Each BatchNorm of the selection once, with every position it is registered at
    (a module used twice has two), when all of them are inside the selection: one used
    outside too is left alone (its parameters keep training there, see ``ties``)."""
    inside: dict[int, list[str]] = {}
    layers: dict[int, nn.Module] = {}
    for block in selection.blocks:
        for name, m in block.named_modules(selection.walked):
            if is_batchnorm(m) and name not in inside.setdefault(id(m), []):
                inside[id(m)].append(name)
                layers[id(m)] = m
    if not layers or not selection.sharing[0]:  # no module registered twice: all inside
        return [(inside[key], layers[key]) for key in layers]
    # a module registered at several places: every position of each layer, inside when
    # reached through an edited block under any of its names (see ``ties.Inside``)
    edited = ties.Inside(selection.model, [(b.name, b.module, b.recurse) for b in selection.blocks])
    positions: dict[int, list[str]] = {}
    for name, m in edited.modules.items():
        if id(m) in layers:
            positions.setdefault(id(m), []).append(name)
    return [
        (positions[key], layers[key])
        for key in layers
        if all(edited.module(name) for name in positions[key])
    ]


def _swap_all(root: nn.Module, names: list[str], new: nn.Module, tx: Transaction) -> None:
    for name in names:
        _swap(root, name, new, tx)


def held_instead(selection: Selection) -> Counter:
    """The BatchNorm kinds of the selection that the ``frozen`` policy holds in eval
    instead of swapping (not a plain BatchNorm2d with running statistics), by class name."""
    return Counter(
        type(bn).__name__
        for _, bn in _named_batchnorms(selection)
        if isinstance(bn, _BatchNorm)
        and not (type(bn) is nn.BatchNorm2d and bn.track_running_stats)
        and not is_held(bn)
    )


def _swap_in_copies(
    copies: Sequence[nn.Module],
    names: list[str],
    make: Callable[[nn.Module], nn.Module],
    tx: Transaction,
) -> None:
    """The same swap in each EMA copy, on the copy's own layer at the same place, so the
    copy stays shaped like its model (its values stay its own)."""
    for copy in copies:
        new = make(copy.get_submodule(names[0]))
        _swap_all(copy, names, new, tx)


def apply(
    selection: Selection, policy: str, tx: Transaction, *, copies: Sequence[nn.Module] = ()
) -> Counter:
    """Apply ``policy`` to every BatchNorm inside a block being frozen; count the modes.
    ``copies``: the model's EMA copies, whose layers are swapped alike."""
    modes: Counter = Counter()
    for names, bn in _named_batchnorms(selection):
        if policy == "train":
            if is_held(bn):
                _release(bn, selection.model.training, tx)
        elif policy == "frozen" and type(bn) is nn.BatchNorm2d and bn.track_running_stats:
            bn = _frozen_copy(bn)
            _swap_all(selection.model, names, bn, tx)
            _swap_in_copies(
                copies, names, lambda layer: _frozen_copy(cast(nn.BatchNorm2d, layer)), tx
            )
        elif isinstance(bn, _BatchNorm):
            _hold(bn, tx)
        modes[mode(bn)] += 1
    return modes


def release(
    selection: Selection, tx: Transaction, *, copies: Sequence[nn.Module] = ()
) -> tuple[dict[int, nn.Module], Counter]:
    """Undo any policy on the BatchNorm layers of blocks being unfrozen.

    Held layers follow the model's train/eval mode again; FrozenBatchNorm2d layers become
    the BatchNorm2d they replaced (same momentum, eps, affine), with their statistics, at
    every position they hold. Returns the swapped modules by old ``id`` and the modes
    the layers are in afterwards. ``copies``: the model's EMA copies, swapped back alike.
    """
    training = selection.model.training
    swapped: dict[int, nn.Module] = {}
    modes: Counter = Counter()
    for names, bn in _named_batchnorms(selection):
        if is_frozen_batchnorm(bn):
            new = _restored(bn, training, tx)
            _swap_all(selection.model, names, new, tx)
            swapped[id(bn)] = bn = new
            _swap_in_copies(copies, names, lambda old: _restored(old, training, tx), tx)
        elif is_held(bn):
            _release(bn, training, tx)
        modes[mode(bn)] += 1
    return swapped, modes
