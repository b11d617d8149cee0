"""LoRA as surgery: peft's low-rank adapters put into the live model in place, merged into
it, or switched off and on, with the optimizer kept in step.

- ``add``: each targeted ``Linear`` / ``Conv1D`` / ``Conv2d`` / ``Embedding`` is wrapped
  in peft's LoRA layer, as ``get_peft_model`` wraps it (B starts at zero: outputs are
  unchanged; DoRA and rsLoRA as options). Only the targeted layers change trainability: their
  base weight and bias stop training and leave the optimizer (state set aside for undo,
  as a freeze does); the adapters join one new param group at a base lr, following the
  head group's schedule as a new ``unfreeze`` group does.
- ``merge``: peft folds the adapters into the base weights and the base layers go back
  where they were (parameter names and module types as before ``add``), trainable as
  they were before it; the adapters leave the optimizer (their group stays, emptied).
- ``switch``: the adapters' contribution off or on, nothing else changed.

The model object stays the same (no PeftModel around it). As peft keeps its adapters on
the model, a LoRA layer that ``add`` made carries, in its attribute :data:`BASE_FLAGS`,
the requires_grad flags its base layer's parameters had before (``merge`` restores them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..errors import TorchMagicError
from ..integrations import peft
from ..modules import parent_of, unique_parameters
from ..options import LoraOptions
from . import optimizer_sync, scheduler_sync
from .edits import (
    BoundModel,
    _drop_grads,
    _numel,
    _set_requires_grad,
    check_ema_owners,
    check_new_group,
    head_group,
)
from .optimizer_sync import OptimizerEditor
from .results import Effect
from .selection import Selection
from .transaction import Transaction

GROUP = "lora"

# The attribute of a LoRA layer made by ``add``: its base parameters' requires_grad flags
# before (a plain tuple: it stays out of the state_dict and goes with copies of the model).
BASE_FLAGS = "torchmagic_base_flags"


def _kind(module: nn.Module) -> str:
    return type(module).__name__


def _inside_lora(model: nn.Module, named: Sequence[tuple[str, nn.Module]]) -> set[str]:
    """Qualified names of the modules that are parts of LoRA layers (their base layers
    and adapters), never targets themselves; ``named``: the model's modules by name."""
    return {
        f"{name}.{inner}"
        for name, layer in peft.lora_layers(model, named)
        for inner, _ in layer.named_modules()
        if inner
    }


def _uncalled(named: Sequence[tuple[str, nn.Module]]) -> set[str]:
    """Qualified names of layers whose forward never runs: a MultiheadAttention's
    ``out_proj`` (it reads the weight directly), which an adapter would not change;
    ``named``: the model's modules by name."""
    return {
        f"{name}.out_proj" if name else "out_proj"
        for name, m in named
        if isinstance(m, nn.MultiheadAttention)
    }


def targets(selection: Selection) -> list[tuple[str, nn.Module]]:
    """The layers LoRA adapts in ``selection``: each block that is one of
    :func:`peft.adaptable`, and those inside the others. A block with none, or already
    adapted, is refused."""
    named = selection.walked.modules
    inside = _inside_lora(selection.model, named)
    uncalled = _uncalled(named)
    found: dict[str, nn.Module] = {}
    for block in selection.blocks:
        if peft.is_lora_layer(block.module) or block.name in inside:
            raise TorchMagicError(f"{block.name} already has LoRA adapters", param="targets")
        if block.name in uncalled:
            raise TorchMagicError(
                f"{block.name} is a MultiheadAttention's output projection, whose forward "
                "never runs (the attention reads its weight): adapt other Linear layers",
                param="targets",
            )
        modules = block.module.named_modules(prefix=block.name) if block.recurse else ()
        hits = [
            (n, m)
            for n, m in modules
            if peft.adaptable(m)
            and n not in inside
            and n not in uncalled
            and not peft.is_lora_layer(m)
        ]
        if not hits:
            kinds = peft.KINDS
            what = f"a {_kind(block.module)}"
            if block.module._modules:
                what += f" with no {kinds} outside LoRA layers"
            raise TorchMagicError(
                f"{block.name or 'the model'} is {what}: LoRA adapts {kinds} layers",
                param="targets",
            )
        for name, module in hits:
            if peft.is_quantized(module):
                raise TorchMagicError(
                    f"{name} is a bitsandbytes {_kind(module)} (quantized weights): its LoRA "
                    "layer is peft's quantized one; build the model with peft's "
                    "get_peft_model and use the PeftModel",
                    param="targets",
                )
            found.setdefault(name, module)
    return list(found.items())


def check_options(options: LoraOptions) -> LoraOptions:
    """``options``, checked (but ``lr``: the command checks it, after its targets)."""
    r, alpha, dropout = options.r, options.alpha, options.dropout
    use_dora, use_rslora = options.use_dora, options.use_rslora
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise TorchMagicError(f"r must be a positive integer, got {r!r}", param="r")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise TorchMagicError(f"alpha must be a positive number, got {alpha!r}", param="alpha")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise TorchMagicError(f"dropout must be in [0, 1), got {dropout!r}", param="dropout")
    for key, flag in (("use_dora", use_dora), ("use_rslora", use_rslora)):
        if not isinstance(flag, bool):
            raise TorchMagicError(f"{key} must be True or False, got {flag!r}", param=key)
    return options


def _record(layer: nn.Module, flags: tuple[bool, ...] | None, tx: Transaction) -> None:
    """Set (or, with None, remove) ``layer``'s :data:`BASE_FLAGS`; undone with tx."""
    old = getattr(layer, BASE_FLAGS, None)
    tx.add(lambda: _set_flags(layer, old))
    _set_flags(layer, flags)


def _set_flags(layer: nn.Module, flags: tuple[bool, ...] | None) -> None:
    if flags is not None:
        setattr(layer, BASE_FLAGS, flags)
    elif hasattr(layer, BASE_FLAGS):
        delattr(layer, BASE_FLAGS)


def _group_name(opt: torch.optim.Optimizer) -> str:
    """``lora``, unless a group of that name still holds adapters (``lora 2`` …)."""
    taken = {g.get("name") for g in opt.param_groups if g["params"]}
    name, k = GROUP, 1
    while name in taken:
        k += 1
        name = f"{GROUP} {k}"
    return name


def add(
    target: BoundModel,
    selection: Selection,
    options: LoraOptions,
    tx: Transaction,
    later: Sequence[str] = (),
) -> Effect:
    """Adapt the selected layers with LoRA made with ``options``; the adapters train in
    a new group at base lr ``options.lr`` (default: the head group's base lr). ``later``:
    what will build an optimizer for the model later (said in the notes)."""
    check_ema_owners(target)
    opt = target.optimizer
    lr = options.lr
    if opt is None and lr is not None:
        raise TorchMagicError(
            f"lr needs an optimizer, and none holds parameters of '{target.model_name}'",
            param="lr",
        )
    layers = targets(selection)
    _check_groups(layers, options.r)
    adapter = peft.adapter_name(target.model, target.walked.modules)
    made = [(name, base, peft.make_lora_layer(base, adapter, options)) for name, base in layers]
    bases = unique_parameters(base for _, base, _ in made)
    adapters = [p for _, _, layer in made for p in peft.adapter_parameters(layer)]
    freed = 0
    if opt is not None:
        head = head_group(target, exclude=bases) or 0
        base_lr = lr if lr is not None else scheduler_sync.base_lr(opt, target.schedulers, head)
        check_new_group(target, opt, [head])
        scheduler_sync.snapshot(target.schedulers, opt, tx)
        editor = OptimizerEditor(opt, tx, target.model)
        freed = editor.remove(bases)
    for _, base, layer in made:
        _record(layer, tuple(p.requires_grad for p in base.parameters()), tx)
    _set_requires_grad(bases, False, tx)
    _drop_grads(bases, tx)
    tx.stops_after_undo.extend(adapters)
    for name, _, layer in made:
        parent, attr = parent_of(target.model, name)
        tx.set_attr(parent, attr, layer)
    for _, copy in target.ema_copies:
        _adapt_copy(copy, [(n, layer) for n, _, layer in made], adapter, options, tx)
    if opt is not None:
        index = editor.add_group(adapters, name=_group_name(opt), lr=base_lr, template=opt.defaults)
        scheduler_sync.follow(target.schedulers, opt, index, head, base_lr)
    notes = (
        f"{_variant(options)} rank {options.r}, alpha {options.alpha:g} (scale "
        f"{options.scale:g}); the base weights of {len(made)} layer(s) frozen; outputs "
        "unchanged (B starts at zero)",
        *(f"EMA copy `{path}`: the same adapters (copies)" for path, _ in target.ema_copies),
        *later,
    )
    return Effect(tuple(n for n, _, _ in made), _numel(adapters), freed, notes=notes)


def _check_groups(layers: Sequence[tuple[str, nn.Module]], r: int) -> None:
    """peft adapts a grouped convolution only with a rank its groups divide; refused
    before peft raises, by name, with the ranks that work."""
    for name, layer in layers:
        groups = getattr(layer, "groups", 1)
        if isinstance(layer, nn.modules.conv._ConvNd) and groups > 1 and r % groups:
            raise TorchMagicError(
                f"{name} is a {_kind(layer)} with groups={groups}: peft's LoRA takes it only "
                f"with a rank that is a multiple of {groups} (r is {r}); choose r={groups} "
                "or leave this layer out",
                param="r",
            )


def _variant(options: LoraOptions) -> str:
    """The adapters' kind, as peft's papers name them: LoRA, DoRA, rsLoRA, rsDoRA."""
    kind = "DoRA" if options.use_dora else "LoRA"
    return f"rs{kind}" if options.use_rslora else kind


def _adapt_copy(
    copy: nn.Module,
    made: Sequence[tuple[str, nn.Module]],
    adapter: str,
    options: LoraOptions,
    tx: Transaction,
) -> None:
    """The same LoRA layers in an EMA copy, their adapters starting as copies of the
    model's (trainable as the copy's base weights are), so the copy keeps averaging the
    model parameter by parameter."""
    for name, layer in made:
        old = copy.get_submodule(name)
        twin = peft.make_lora_layer(old, adapter, options)
        trains = next((p.requires_grad for p in old.parameters()), False)
        with torch.no_grad():
            pairs = zip(peft.adapter_parameters(twin), peft.adapter_parameters(layer), strict=True)
            for mine, theirs in pairs:
                mine.copy_(theirs)
                mine.requires_grad_(trains)
        parent, attr = parent_of(copy, name)
        tx.set_attr(parent, attr, twin)


def _fold(root: nn.Module, name: str, layer: nn.Module, tx: Transaction) -> list[nn.Parameter]:
    """Merge the LoRA ``layer`` at ``name`` into its base layer and put the base layer in
    its place (undone with ``tx``, weights bit for bit); the base layer's parameters."""
    base = peft.base_of(layer)
    params = list(base.parameters())
    saved = [p.detach().clone() for p in params]
    merged = peft.merged_adapters(layer)
    tx.hold(saved)

    def restore() -> None:
        with torch.no_grad():
            for p, old in zip(params, saved, strict=True):
                p.copy_(old)
        peft.unmark_merged(layer, merged)

    tx.add(restore)
    with torch.no_grad():
        peft.merge(layer)
    parent, attr = parent_of(root, name)
    tx.set_attr(parent, attr, base)
    return params


def _adapted(model: nn.Module, model_name: str) -> list[tuple[str, nn.Module]]:
    layers = peft.lora_layers(model)
    if not layers:
        raise TorchMagicError(f"'{model_name}' has no LoRA adapters")
    return layers


def merge(target: BoundModel, tx: Transaction) -> Effect:
    """Fold every LoRA layer of the model into its base layer and put the base layer back
    in its place, trainable as before the adapters came (peft's own layers: as they are
    now); the adapters leave the optimizer."""
    check_ema_owners(target)
    layers = _adapted(target.model, target.model_name)
    adapters = [p for _, layer in layers for p in peft.adapter_parameters(layer)]
    opt = target.optimizer
    if opt is not None:
        scheduler_sync.snapshot(target.schedulers, opt, tx)
        editor = OptimizerEditor(opt, tx, target.model)
        editor.remove(adapters)
    _set_requires_grad(adapters, False, tx)
    _drop_grads(adapters, tx)
    tx.trains_after_undo.extend(adapters)
    tx.hold(adapters)  # the LoRA layers leave the model: only the log keeps them
    retrain: list[nn.Parameter] = []
    for name, layer in layers:
        before = getattr(layer, BASE_FLAGS, None)
        if before is None:  # none recorded: as its base trains now
            before = tuple(p.requires_grad for p in peft.base_of(layer).parameters())
        params = _fold(target.model, name, layer, tx)
        _record(layer, None, tx)
        retrain += [p for p, flag in zip(params, before, strict=True) if flag]
    for _, copy in target.ema_copies:
        for name, layer in peft.lora_layers(copy):
            _fold(copy, name, layer, tx)
    _set_requires_grad(retrain, True, tx)
    if opt is not None and retrain:
        book = optimizer_sync.homes(opt)
        by_home: dict[int, list[nn.Parameter]] = {}
        for p in retrain:
            home = book.index(opt, p)
            if home is not None:
                by_home.setdefault(home, []).append(p)
        for home, ps in by_home.items():
            editor.join(home, ps)
    notes = (
        (f"{_numel(retrain)} merged base weights train again, as before LoRA",) if retrain else ()
    )
    return Effect(tuple(n for n, _ in layers), _numel(adapters), notes=notes)


def switch(target: BoundModel, on: bool, tx: Transaction) -> Effect:
    """Turn the model's adapters on or off (outputs without them), nothing else."""
    layers = _adapted(target.model, target.model_name)
    changed = [(n, layer) for n, layer in layers if peft.enabled(layer) != on]

    def restore() -> None:
        for _, layer in changed:
            peft.set_enabled(layer, not on)

    tx.add(restore)
    for _, layer in changed:
        peft.set_enabled(layer, on)
    adapters = [p for _, layer in changed for p in peft.adapter_parameters(layer)]
    return Effect(tuple(n for n, _ in layers), _numel(adapters))


def adapter_count(model: nn.Module) -> int:
    """Parameters of the model's LoRA adapters."""
    return _numel(peft.adapters_of(model))


def ranks(model: nn.Module) -> dict[str, int]:
    """The rank of each LoRA layer, by qualified name."""
    return {name: peft.rank(layer) for name, layer in peft.lora_layers(model)}
