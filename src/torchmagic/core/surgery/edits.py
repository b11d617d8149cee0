"""The three model edits — freeze, unfreeze, replace_head — on explicit live objects.

Each step validates what it can before touching anything, then records every mutation in
the transaction, so a failure part-way rolls back and ``undo`` can replay the inverses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import TorchMagicError
from ..modules import is_batchnorm, parent_of, unique_parameters
from . import batchnorm, heads, model_config, scheduler_sync
from .optimizer_sync import OptimizerEditor, group_index
from .results import Effect
from .selection import Block, Selection
from .transaction import Transaction


@dataclass
class BoundModel:
    """The live objects one command acts on."""

    model: nn.Module
    model_name: str
    optimizer: torch.optim.Optimizer | None = None
    optimizer_name: str | None = None
    schedulers: list = field(default_factory=list)


def _set_requires_grad(params: Sequence[nn.Parameter], flag: bool, tx: Transaction) -> None:
    changed = [p for p in params if p.requires_grad != flag]
    for p in changed:
        p.requires_grad_(flag)
    tx.add(lambda: [p.requires_grad_(not flag) for p in changed])


def _drop_grads(params: Sequence[nn.Parameter], tx: Transaction) -> None:
    """``.grad = None`` to free memory; kept only until commit so a rollback is exact."""
    held = [(p, p.grad) for p in params if p.grad is not None]
    for p, _ in held:
        p.grad = None
    tx.add(lambda: [setattr(p, "grad", g) for p, g in held])
    tx.on_commit(held.clear)


def _numel(params: Sequence[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


def freeze(target: BoundModel, selection: Selection, bn_policy: str, tx: Transaction) -> Effect:
    params = selection.parameters()
    if not params and not any(is_batchnorm(m) for m in selection.modules()):
        raise TorchMagicError(f"nothing to freeze: {', '.join(selection.names)} has no parameters")
    freed = 0
    if target.optimizer is not None:
        freed = OptimizerEditor(target.optimizer, tx, target.model).remove(params)
    _set_requires_grad(params, False, tx)
    _drop_grads(params, tx)
    modes = batchnorm.apply(selection, bn_policy, tx)
    return Effect(selection.names, _numel(params), freed, dict(modes))


def head_group(target: BoundModel, exclude: Sequence[nn.Parameter] = ()) -> int | None:
    """Index of the group training the head: the one holding the model's last parameter
    that is in the optimizer (and not among ``exclude``)."""
    if target.optimizer is None:
        return None
    where = group_index(target.optimizer)
    skip = {id(p) for p in exclude}
    held = [p for p in reversed(list(target.model.parameters())) if id(p) in where]
    for p in held:
        if id(p) not in skip:
            return where[id(p)]
    return where[id(held[0])] if held else None


def _group_name(block: Block, model_name: str) -> str:
    return block.name or model_name


def unfreeze(
    target: BoundModel,
    selection: Selection,
    lrs: Sequence[float | None],
    weight_decay: float | None,
    lr_ratio: float,
    tx: Transaction,
) -> Effect:
    opt = target.optimizer
    explicit = any(lr is not None for lr in lrs) or weight_decay is not None
    if opt is None and explicit:
        raise TorchMagicError(
            f"lr=/wd= need an optimizer, and none holds parameters of '{target.model_name}'; "
            "create one (e.g. optimizer = torch.optim.AdamW(model.parameters())) or pass --opt"
        )
    ref = None
    if opt is not None:
        ref = head_group(target, exclude=selection.parameters())
        ref = 0 if ref is None else ref
        if weight_decay is not None and "weight_decay" not in opt.param_groups[ref]:
            raise TorchMagicError(f"{type(opt).__name__} has no weight_decay to set")
        scheduler_sync.check_followable(target.schedulers, opt, ref)
        scheduler_sync.snapshot(target.schedulers, opt, tx)
    swapped, modes = batchnorm.release(selection, tx)
    blocks = [
        Block(b.name, swapped.get(id(b.module), b.module), b.recurse) for b in selection.blocks
    ]
    all_params: list[nn.Parameter] = []
    notes: list[str] = []
    seen: set[int] = set()
    if opt is not None:
        editor = OptimizerEditor(opt, tx, target.model)
        template = opt.param_groups[ref]
        ref_lr = float(template["lr"])
        for block, lr in zip(blocks, lrs, strict=True):
            params = [p for p in block.parameters() if id(p) not in seen]
            seen.update(id(p) for p in params)
            all_params.extend(params)
            if not params:
                continue
            index = editor.add_group(
                params,
                name=_group_name(block, target.model_name),
                lr=lr if lr is not None else lr_ratio * ref_lr,
                template=template,
                weight_decay=weight_decay,
            )
            scheduler_sync.follow(target.schedulers, opt, index, ref)
    else:
        all_params = Selection(selection.model, tuple(blocks)).parameters()
        notes.append("no optimizer holds this model's parameters: only requires_grad changed")
    if not all_params:
        raise TorchMagicError(
            f"nothing to unfreeze: {', '.join(selection.names)} has no parameters"
        )
    _set_requires_grad(all_params, True, tx)
    return Effect(selection.names, _numel(all_params), 0, dict(modes), tuple(notes))


def replace_head(
    target: BoundModel,
    root: nn.Module,
    root_name: str,
    num_classes: int,
    dropout: float | None,
    tx: Transaction,
    labels: Sequence[str] | None = None,
) -> Effect:
    """Replace the heads found in ``root`` (at ``root_name`` inside the model), and keep
    the model's class count and label map in step (:mod:`.model_config`)."""
    if num_classes < 1:
        raise TorchMagicError(
            f"the number of classes must be at least 1, got {num_classes}", param="num_classes"
        )
    if dropout is not None and not 0 <= dropout < 1:
        raise TorchMagicError(f"--dropout must be in [0, 1), got {dropout}", param="dropout")
    found = heads.locate(target.model, None if root is target.model else root_name)
    model_config.check_labels(target.model, found, num_classes, labels)
    located = [(h.name, h.module) for h in found]
    new_modules = [heads.build_head(module, num_classes, dropout) for _, module in located]
    old_params = unique_parameters([m for _, m in located])
    opt = target.optimizer
    ref = None
    if opt is not None:
        where = group_index(opt)
        held = [where[id(p)] for p in old_params if id(p) in where]
        ref = held[0] if held else None
        scheduler_sync.check_followable(target.schedulers, opt, 0 if ref is None else ref)
        scheduler_sync.snapshot(target.schedulers, opt, tx)
        editor = OptimizerEditor(opt, tx, target.model)
        only_head = ref is not None and {id(p) for p in opt.param_groups[ref]["params"]} <= {
            id(p) for p in old_params
        }
        editor.remove(old_params)
    for (name, _), new in zip(located, new_modules, strict=True):
        parent, attr = parent_of(target.model, name)
        tx.set_attr(parent, attr, new)
    synced = model_config.sync(target.model, found, num_classes, labels, tx)
    new_params = unique_parameters(new_modules)
    notes = []
    if opt is not None:
        if only_head:
            editor.set_params(ref, new_params)
        else:
            source = opt.param_groups[0 if ref is None else ref]
            lr = float(source["lr"]) if ref is not None else float(opt.defaults["lr"])
            index = editor.add_group(new_params, name=located[0][0], lr=lr, template=source)
            scheduler_sync.follow(target.schedulers, opt, index, 0 if ref is None else ref)
    else:
        notes.append("no optimizer holds this model's parameters: create one for the new head")
    old_shape = f"{found[0].in_features}→{found[0].out_features}"
    notes.insert(
        0,
        f"{located[0][0]}: {type(found[0].module).__name__} {old_shape} "
        f"replaced by {found[0].in_features}→{num_classes}",
    )
    for role in ("distillation", "auxiliary"):
        also = [h.name for h in found if h.role == role]
        if also:
            notes.append(f"{role} heads replaced too: {', '.join(also)}")
    notes.extend(synced)
    return Effect(tuple(n for n, _ in located), _numel(new_params), 0, {}, tuple(notes))
