"""The three model edits — freeze, unfreeze, replace_head — on explicit live objects.

Each step validates what it can before touching anything, then records every mutation in
the transaction, so a failure part-way rolls back and ``undo`` can replay the inverses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..advice import Advice, Call, Option
from ..errors import TorchMagicError
from ..integrations import peft
from ..integrations.lookup import state_of
from ..modules import ModelWalk, is_batchnorm, parameter_names, parent_of, unique_parameters
from ..options import ReplaceHeadOptions
from . import batchnorm, heads, model_config, optimizer_sync, replaced, scheduler_sync, ties
from .counting import group_keys, scan
from .model_checks import check_lr
from .optimizer_sync import OptimizerEditor, group_index, group_label
from .results import Counts, Effect
from .selection import Block, Selection
from .transaction import Transaction


@dataclass(frozen=True)
class OtherOptimizer:
    """Another optimizer holding some of the model's parameters (or their home groups),
    with the schedulers driving it: each parameter is edited in the optimizer holding it."""

    name: str
    optimizer: torch.optim.Optimizer
    schedulers: list
    rebuilt: str | None = None  # as BoundModel's
    holders: list = field(default_factory=list)  # as BoundModel's


@dataclass
class BoundModel:
    """The live objects one command acts on, and its model as walked when it was bound
    (before the command changes anything)."""

    model: nn.Module
    model_name: str
    walked: ModelWalk
    optimizer: torch.optim.Optimizer | None = None
    optimizer_name: str | None = None
    schedulers: list = field(default_factory=list)
    # what the namespace calls each object, by identity (schedulers in summaries)
    names: dict[int, str] = field(default_factory=dict)
    # why the optimizer is about to be replaced by its owner (None: it is the user's)
    rebuilt: str | None = None
    # EMA copies of the model: (path, averaged copy), kept in step with its structure
    ema_copies: list[tuple[str, nn.Module]] = field(default_factory=list)
    # why a copy shaped like the model has no known owner (edits of its structure refuse)
    ema_unclear: str | None = None
    # objects that may set the optimizer's lrs or the model's trainability on their own
    # (discovery.Holder): named by the command, refused when a new group would lose its lr
    holders: list = field(default_factory=list)
    # the other optimizers holding the model's parameters (a backbone's and a head's)
    others: list[OtherOptimizer] = field(default_factory=list)
    # whether the user named the optimizer for this command (then it takes what it is given)
    named: bool = False

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer holding the model's parameters, its own first."""
        own = [] if self.optimizer is None else [self.optimizer]
        return own + [o.optimizer for o in self.others]

    def held(self) -> dict[int, int]:
        """Which param group holds each parameter, by ``id``, in any of its optimizers."""
        where: dict[int, int] = {}
        for opt in reversed(self.optimizers()):
            where.update(group_index(opt))
        return where

    def with_optimizer(self, other: OtherOptimizer) -> BoundModel:
        """This model bound to ``other`` instead: what editing it there reads."""
        return replace(
            self,
            optimizer=other.optimizer,
            optimizer_name=other.name,
            schedulers=other.schedulers,
            rebuilt=other.rebuilt,
            holders=other.holders,
            others=[],
        )


def check_new_group(target: BoundModel, opt: torch.optim.Optimizer, refs: Sequence[int]) -> None:
    """Refuse, before anything changes, a new param group following the groups ``refs``
    that a scheduler could not follow or that an object would give another lr."""
    for holder in target.holders:
        if holder.refuses:
            raise TorchMagicError(
                f"{holder.line} of '{target.optimizer_name}', so a new param group would "
                "lose its lr there; recreate it after this change with param_group_index "
                "for each group (ignite ParamGroupScheduler)"
            )
    scheduler_sync.check_followable(target.schedulers, opt, refs)


def check_ema_owners(target: BoundModel) -> None:
    """An edit of the model's structure that its EMA copies must follow refuses while a
    copy shaped like the model has no known owner (it would edit the wrong model's)."""
    if target.ema_unclear is not None:
        raise TorchMagicError(target.ema_unclear)


def _set_requires_grad(params: Sequence[nn.Parameter], flag: bool, tx: Transaction) -> None:
    changed = [p for p in params if p.requires_grad != flag]
    tx.add(lambda: [p.requires_grad_(not flag) for p in changed])
    (tx.stops_after_undo if flag else tx.trains_after_undo).extend(changed)
    for p in changed:
        p.requires_grad_(flag)


def _drop_grads(params: Sequence[nn.Parameter], tx: Transaction) -> None:
    """``.grad = None`` to free memory; kept only until commit so a rollback is exact."""
    held = [(p, p.grad) for p in params if p.grad is not None]

    def restore() -> None:
        for p, grad in held:
            p.grad = grad

    tx.add(restore)
    tx.on_commit(held.clear)
    for p, _ in held:
        p.grad = None


def _numel(params: Sequence[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


def _acted_on(selection: Selection) -> list[Block]:
    """The blocks a freeze or unfreeze can change: those with parameters or BatchNorm
    (an activation or a pooling layer carved out by an exclusion is not listed)."""
    walked = selection.walked
    return [
        b
        for b in selection.blocks
        if b.parameters(walked) or any(is_batchnorm(m) for m in b.modules(walked))
    ]


def _states(
    target: BoundModel, model: nn.Module, blocks: Sequence[Block], walked: ModelWalk | None = None
) -> list[tuple]:
    """What a freeze or unfreeze can change in each block (looked up by name, so a swapped
    BatchNorm counts): its modules' identity, mode and pre-hooks, its parameters'
    trainability and optimizer membership (in any of the model's optimizers). ``walked``:
    the model's walk, when nothing has changed since (else each block is walked once)."""
    held = target.held()
    states = []
    for block in blocks:
        live = Block(block.name, model.get_submodule(block.name), block.recurse)
        modules = live.modules(walked)
        states.append(
            (
                tuple((id(m), m.training, len(m._forward_pre_hooks)) for m in modules),
                tuple(
                    (id(p), p.requires_grad, id(p) in held)
                    for p in unique_parameters(modules, recurse=False)
                ),
            )
        )
    return states


@dataclass(frozen=True)
class Measured:
    """A model's totals, and everything a surgery command can change in the model and its
    optimizer (``state``: compared after the command, so that one that changed nothing can
    say so and leave no history entry), from one walk of the model."""

    counts: Counts
    state: tuple
    parameters: tuple[nn.Parameter, ...]  # the model's, each once (what invariants check)
    modules: tuple[tuple[str, nn.Module], ...]  # by their first path, in pre-order


def measure(target: BoundModel, walked: ModelWalk) -> Measured:
    """``target`` measured from ``walked``, its model's walk (no walk of its own)."""
    held = group_index(target.optimizer) if target.optimizer is not None else {}
    named = walked.modules
    scanned = scan(target.model, held, [m for _, m in named])
    state = (
        scanned.modules,
        scanned.parameters,
        tuple(tuple(group_keys(opt).values()) for opt in target.optimizers()),
        tuple(peft.enabled(m) for _, m in named if peft.is_lora_layer(m)),
    )
    return Measured(scanned.counts, state, scanned.held_by_model, named)


def _effect(
    target: BoundModel,
    selection: Selection,
    blocks: Sequence[Block],
    before: Sequence[tuple],
    flipped: Sequence[nn.Parameter],
    *,
    state_freed_bytes: int = 0,
    bn_modes: Mapping[str, int] | None = None,
    notes: Sequence[str] = (),
    resynced: Sequence[nn.Parameter] = (),
) -> Effect:
    """The Effect of a freeze or unfreeze: the blocks, which of them were already as the
    command leaves them (their state in ``before`` is unchanged), the parameters whose
    trainability ``flipped``, and what ``--except`` kept out."""
    names = tuple(b.name or "(whole model)" for b in blocks)
    after = _states(target, selection.model, blocks)
    already = tuple(name for name, old, new in zip(names, before, after, strict=True) if old == new)
    if selection.excluded:
        names = selection.scope
    return Effect(
        names,
        _numel(flipped),
        state_freed_bytes,
        dict(bn_modes or {}),
        tuple(notes),
        already=already,
        excluded=selection.excluded,
        resynced=_numel(resynced),
    )


def _ties(target: BoundModel, selection: Selection) -> list[ties.Tie]:
    """Parameters of the selection that modules outside it use too."""
    blocks = ((b.name, b.module, b.recurse) for b in selection.blocks)
    return ties.find(target.model, blocks, selection.sharing, by_module=True)


def freeze(target: BoundModel, selection: Selection, bn_policy: str, tx: Transaction) -> Effect:
    params = selection.parameters()
    tied = [t for t in _ties(target, selection) if t.param.requires_grad]
    if tied:  # a module outside the selection still trains them
        kept = {id(t.param) for t in tied}
        params = [p for p in params if id(p) not in kept]
    notes = tuple(
        f"{t.describe()}: it keeps training (freeze {t.own_modules} and {t.other_modules} in "
        "one command to stop it)"
        for t in tied
    )
    if bn_policy == "train" and (norms := batchnorm.trained_norms(selection)):
        params = [p for p in params if id(p) not in norms]
        notes += (
            f"{len(norms)} normalization tensors keep training (BN policy train, as "
            "fastai's train_bn)",
        )
    if bn_policy == "frozen" and (kinds := batchnorm.held_instead(selection)):
        held_kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        notes += (f"--bn frozen swaps BatchNorm2d only: {held_kinds} held in eval instead",)
    if not params and not any(is_batchnorm(m) for m in selection.modules()):
        why = "; ".join(notes) or f"{', '.join(selection.names)} has no parameters"
        raise TorchMagicError(f"nothing to freeze: {why}")
    blocks = _acted_on(selection)
    before = _states(target, selection.model, blocks, selection.walked)
    flipped = [p for p in params if p.requires_grad]
    held = target.held()
    resynced = [p for p in params if not p.requires_grad and id(p) in held]
    freed = 0
    if target.optimizer is not None:
        freed = OptimizerEditor(target.optimizer, tx, target.model).remove(params)
    for other in target.others:  # each parameter leaves every optimizer holding it
        where = group_index(other.optimizer)
        if leaving := [p for p in params if id(p) in where]:
            freed += OptimizerEditor(other.optimizer, tx, target.model).remove(leaving)
    _set_requires_grad(params, False, tx)
    _drop_grads(params, tx)
    copies = [copy for _, copy in target.ema_copies]
    modes = batchnorm.apply(selection, bn_policy, tx, copies=copies)
    return _effect(
        target,
        selection,
        blocks,
        before,
        flipped,
        state_freed_bytes=freed,
        bn_modes=dict(modes),
        notes=notes,
        resynced=resynced,
    )


def head_group(target: BoundModel, exclude: Sequence[nn.Parameter] = ()) -> int | None:
    """Index of the group training the head: the one holding the model's last parameter
    that is in the optimizer (and not among ``exclude``)."""
    if target.optimizer is None:
        return None
    where = group_index(target.optimizer)
    skip = {id(p) for p in exclude}
    held = [p for p in reversed(target.walked.parameters) if id(p) in where]
    for p in held:
        if id(p) not in skip:
            return where[id(p)]
    return where[id(held[0])] if held else None


def _group_name(block: Block, model_name: str) -> str:
    return block.name or model_name


@dataclass
class _NewGroup:
    """A param group an unfreeze makes: its members, the hyper-parameters it copies
    (``template``), its base lr and the group whose schedule it follows."""

    name: str
    params: list[nn.Parameter]
    template: dict
    base: float
    ref: int


def _by_home_group(
    params: Sequence[nn.Parameter], home_of: Callable[[nn.Parameter], int | None]
) -> list[tuple[int | None, list[nn.Parameter]]]:
    """``params`` split by home group index (None: never in any group), in first-seen order."""
    parts: dict[int | None, list[nn.Parameter]] = {}
    for p in params:
        parts.setdefault(home_of(p), []).append(p)
    return list(parts.items())


def _part_names(
    block_name: str, parts: list[tuple[int | None, list[nn.Parameter]]], opt: torch.optim.Optimizer
) -> list[str]:
    """One group name per home group of a block: the block's name for the part holding
    most of its weights, ``block · no_decay`` (or ``· decay``, or the home group's name)
    for the others."""

    def settings(home: int | None) -> dict:
        return opt.defaults if home is None else opt.param_groups[home]

    main = max(range(len(parts)), key=lambda i: _numel(parts[i][1]))
    main_decay = settings(parts[main][0]).get("weight_decay")
    names: list[str] = []
    for i, (home, _) in enumerate(parts):
        label = "defaults" if home is None else group_label(opt.param_groups[home], home)
        decay = settings(home).get("weight_decay")
        if i == main:
            names.append(block_name)
            continue
        if not decay and main_decay:
            tag = "no_decay"
        elif decay and not main_decay:
            tag = "decay"
        else:
            tag = label
        name = f"{block_name} · {tag}"
        names.append(name if name not in names else f"{name} {label}")
    return names


def _plan(
    target: BoundModel,
    opt: torch.optim.Optimizer,
    blocks: Sequence[tuple[Block, float | None, list[nn.Parameter]]],
    explicit: bool,
    lr_ratio: float,
) -> tuple[list[tuple[int, list[nn.Parameter]]], list[_NewGroup]]:
    """Where an unfreeze puts each block's parameters: back into home groups (no lr given),
    and the new groups it makes (base lr, hyper-parameters, the schedule they follow)."""
    schedulers = target.schedulers
    head = head_group(target, exclude=[p for _, _, ps in blocks for p in ps]) or 0

    def base_of(index: int) -> float:
        return scheduler_sync.base_lr(opt, schedulers, index)

    where = group_index(opt)
    home_of = optimizer_sync.homes(opt).indexer(opt)
    returning: list[tuple[int, list[nn.Parameter]]] = []
    new_groups: list[_NewGroup] = []
    for block, lr, params in blocks:
        parts = _by_home_group(params, home_of) if params else []
        if not explicit:
            returning += [
                (home, away)
                for home, ps in parts
                if home is not None and (away := [p for p in ps if where.get(id(p)) != home])
            ]
            parts = [(home, ps) for home, ps in parts if home is None]
        names = _part_names(_group_name(block, target.model_name), parts, opt) if parts else []
        for name, (home, ps) in zip(names, parts, strict=True):
            follows = home if home is not None and base_of(home) > 0 else head
            if lr is not None:
                base = lr
            elif home is not None:
                base = base_of(home)
            else:
                base = lr_ratio * base_of(head)
            template = opt.defaults if home is None else opt.param_groups[home]
            new_groups.append(_NewGroup(name, ps, template, base, follows))
    return returning, new_groups


def _merged(
    moves: Sequence[tuple[int, list[nn.Parameter]]],
) -> list[tuple[int, list[nn.Parameter]]]:
    """Moves into the same group as one (in order): joining appends, so the groups end
    up the same, and each group is rebuilt once instead of once per block."""
    merged: dict[int, list[nn.Parameter]] = {}
    for index, params in moves:
        merged.setdefault(index, []).extend(params)
    return list(merged.items())


def unfreeze(
    target: BoundModel,
    selection: Selection,
    lrs: Sequence[float | None],
    tx: Transaction,
    *,
    weight_decay: float | None,
    lr_ratio: float,
    later: Sequence[str] = (),
) -> Effect:
    """Train the selection again. ``later``: what will build an optimizer for the model
    later and how to get its groups now (said when lr= has no optimizer to go in).

    Without ``lr``/``weight_decay`` parameters return to their home groups. Otherwise each
    block gets one group per home group of its parameters, at base lr ``lr`` (default: the
    home group's base), with the home group's other hyper-parameters. Parameters never in
    any group take the optimizer's defaults, at ``lr_ratio`` × the head group's base lr
    when no lr is given; a block assigned by hand over a module whose tensors the
    optimizer still holds takes their places instead (they leave, with their state). New
    groups follow the schedule of their home group (else the head group's).
    """
    opt = target.optimizer
    explicit = any(lr is not None for lr in lrs) or weight_decay is not None
    if opt is None and explicit and later:
        raise TorchMagicError(
            f"lr and weight_decay need an optimizer, and none holds parameters of "
            f"'{target.model_name}' yet: {'; '.join(later)}",
            param="lr" if any(lr is not None for lr in lrs) else "wd",
        )
    if opt is None and explicit:
        raise TorchMagicError(
            (
                f"lr and weight_decay need an optimizer, and none holds parameters of "
                f"'{target.model_name}'; create one (e.g. optimizer = "
                "torch.optim.AdamW(model.parameters())) or name it with ",
                Option("optimizer"),
            ),
            param="lr" if any(lr is not None for lr in lrs) else "wd",
        )
    acted_on = _acted_on(selection)
    before = _states(target, selection.model, acted_on, selection.walked)
    swapped, modes = batchnorm.release(
        selection, tx, copies=[copy for _, copy in target.ema_copies]
    )
    blocks = [
        Block(b.name, swapped.get(id(b.module), b.module), b.recurse) for b in selection.blocks
    ]
    all_params: list[nn.Parameter] = []
    per_block: list[list[nn.Parameter]] = []
    seen: set[int] = set()
    walked = None if swapped else selection.walked  # a layer swapped back: walk again
    for block in blocks:
        params = [p for p in block.parameters(walked) if id(p) not in seen]
        seen.update(id(p) for p in params)
        all_params.extend(params)
        per_block.append(params)
    if not all_params:
        raise TorchMagicError(
            f"nothing to unfreeze: {', '.join(selection.names)} has no parameters"
        )
    flipped = [p for p in all_params if not p.requires_grad]
    held = target.held()
    resynced = [p for p in all_params if p.requires_grad and opt is not None and id(p) not in held]
    notes = [
        f"{t.describe()}: those train too"
        for t in _ties(target, replace(selection, blocks=tuple(blocks)))
        if not t.param.requires_grad
    ]
    if opt is not None:
        for part, part_blocks in _routes(target, per_block):
            notes += _into_optimizer(
                part,
                blocks,
                lrs,
                part_blocks,
                tx,
                explicit=explicit,
                weight_decay=weight_decay,
                lr_ratio=lr_ratio,
                walked=walked,
            )
    _set_requires_grad(all_params, True, tx)
    return _effect(
        target, selection, acted_on, before, flipped, bn_modes=modes, notes=notes, resynced=resynced
    )


def _routes(
    target: BoundModel, per_block: Sequence[list[nn.Parameter]]
) -> list[tuple[BoundModel, list[list[nn.Parameter]]]]:
    """Which optimizer each block's parameters go to: the one the user named takes them
    all (unless another trains one already); else a parameter goes to the optimizer
    holding it, or back to the one it left frozen (the command's when it left several),
    or, new to all, to the command's."""
    if not target.others:
        return [(target, list(per_block))]
    if target.named:
        for other in target.others:
            where = group_index(other.optimizer)
            taken = [p for ps in per_block for p in ps if id(p) in where and p.requires_grad]
            if taken:
                name = parameter_names(target.model).get(id(taken[0]), "a parameter")
                raise TorchMagicError(
                    f"{name} is trained by '{other.name}': it cannot join "
                    f"'{target.optimizer_name}' too; unfreeze it without naming an optimizer, "
                    "or freeze it first",
                    param="optimizer",
                )
        return [(target, list(per_block))]
    parts = [target, *(target.with_optimizer(o) for o in target.others)]
    optimizers = target.optimizers()  # the parts', in the same order
    held = [group_index(opt) for opt in optimizers]
    homes = [optimizer_sync.homes(opt).indexer(opt) for opt in optimizers]
    chosen: list[list[list[nn.Parameter]]] = [[[] for _ in per_block] for _ in parts]
    for b, params in enumerate(per_block):
        for p in params:
            places = [i for i, where in enumerate(held) if id(p) in where]
            if not places:
                left = [i for i, home in enumerate(homes) if home(p) is not None]
                places = left[:1] or [0]
            for i in places:
                chosen[i][b].append(p)
    return [(part, ps) for part, ps in zip(parts, chosen, strict=True) if any(ps)]


def _into_optimizer(
    target: BoundModel,
    blocks: Sequence[Block],
    lrs: Sequence[float | None],
    per_block: Sequence[list[nn.Parameter]],
    tx: Transaction,
    *,
    explicit: bool,
    weight_decay: float | None,
    lr_ratio: float,
    walked: ModelWalk | None,
) -> list[str]:
    """Put each block's parameters into ``target``'s optimizer (see :func:`unfreeze`);
    returns the notes it makes. ``walked``: the model's walk, when it still holds the
    blocks."""
    opt = target.optimizer
    assert opt is not None
    if explicit:
        for group in opt.param_groups:
            check_lr(opt, group["lr"])
    if weight_decay is not None and "weight_decay" not in opt.defaults:
        raise TorchMagicError(f"{type(opt).__name__} has no weight_decay to set", param="wd")
    notes: list[str] = []
    schedulers = target.schedulers
    adopted = [] if explicit else _adopted(opt, target.model, blocks, walked)
    taken = {id(new) for _, new in adopted}
    per_block = [[p for p in ps if id(p) not in taken] for ps in per_block]
    planned = list(zip(blocks, lrs, per_block, strict=True))
    returning, new_groups = _plan(target, opt, planned, explicit, lr_ratio)
    if new_groups and target.rebuilt is not None:
        instead = (
            "or unfreeze without lr= (trainability carries into the next fit)"
            if explicit
            else "it holds no group they came from, so they cannot go home without lr="
        )
        raise TorchMagicError(
            f"'{target.optimizer_name}' cannot keep a new param group: {target.rebuilt}; "
            f"give {new_groups[0].name} its group there, {instead}",
            param="lr",
        )
    if new_groups:
        check_new_group(target, opt, sorted({g.ref for g in new_groups}))
    scheduler_sync.snapshot(schedulers, opt, tx)
    editor = OptimizerEditor(opt, tx, target.model)
    if adopted:
        where = group_index(opt)
        places = [(where[id(old)], fresh) for old, fresh in adopted]
        editor.remove([old for old, _ in adopted])
        for index, fresh in places:
            editor.join(index, [fresh])
        notes.append(
            f"{len(adopted)} tensor(s) of the module(s) replaced by hand left the "
            "optimizer with their state; the new ones took their param groups"
        )
    moves = _merged(returning)
    editor.detach_ahead(
        [p for _, ps in moves for p in ps] + [p for g in new_groups for p in g.params]
    )
    for home, ps in moves:
        editor.join(home, ps)
    # read before any emptied group is refilled: one may be its own reference
    factors = [scheduler_sync.present_factor(opt, schedulers, g.ref) for g in new_groups]
    for new, factor in zip(new_groups, factors, strict=True):
        index = editor.add_group(
            new.params,
            name=new.name,
            lr=new.base,
            template=new.template,
            weight_decay=weight_decay,
        )
        scheduler_sync.follow(
            schedulers, opt, index, new.ref, new.base, refresh=False, factor=factor
        )
    if new_groups:
        scheduler_sync.refresh_last_lrs(schedulers, opt)
    return notes


def _adopted(
    opt: torch.optim.Optimizer, model: nn.Module, blocks: Sequence[Block], walked: ModelWalk | None
) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(old, new) for each block assigned by hand over a module the optimizer still holds;
    ``walked``: the model's walk, when it still holds the blocks."""
    finder = replaced.Replaced(opt, model, None if walked is None else walked.parameters)
    return [
        pair
        for b in blocks
        if b.recurse
        for pair in finder.predecessors(b.module, b.parameters(walked))
    ]


def _head_groups(
    opt: torch.optim.Optimizer, old: Sequence[nn.Module], new: Sequence[nn.Module]
) -> tuple[dict[int, list[nn.Parameter]], list[nn.Parameter]]:
    """Where each new head parameter goes: the group of the old head's parameter of the same
    role (weight to weight's, bias to bias's), or, for a frozen old head, its home group.
    Returns those groups' new members, and the parameters with no such group."""
    where = group_index(opt)
    book = optimizer_sync.homes(opt)
    joining: dict[int, list[nn.Parameter]] = {}
    groupless: list[nn.Parameter] = []
    for old_module, new_module in zip(old, new, strict=True):
        by_role = {name.rpartition(".")[2]: p for name, p in old_module.named_parameters()}
        for name, p in new_module.named_parameters():
            twin = by_role.get(name.rpartition(".")[2], by_role.get("weight"))
            index = None
            if twin is not None:
                index = where.get(id(twin), book.index(opt, twin))
            if index is None:
                groupless.append(p)
            else:
                joining.setdefault(index, []).append(p)
    return joining, groupless


# A module's hook tables: the new head adopts the old head's very dicts, so the user's
# handles (which point at the dicts) still remove them.
_HOOK_TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_COUNTED_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _carry_hooks(old: nn.Module, new: nn.Module) -> int:
    """Move the user's hooks of ``old`` onto ``new`` (fresh, none of its own); how many."""
    carried = sum(len(getattr(old, table, ())) for table in _COUNTED_HOOKS)
    if carried:
        for table in _HOOK_TABLES:
            if hasattr(old, table):
                object.__setattr__(new, table, getattr(old, table))
        new._is_full_backward_hook = old._is_full_backward_hook
    return carried


def _copy_heads(
    ema_copy: nn.Module,
    found: Sequence[heads.Head],
    new_modules: Sequence[nn.Module],
    tx: Transaction,
) -> list[heads.Head]:
    """Put a copy of each new head into ``ema_copy`` at the same path, on the device,
    dtype and trainability of the copy's old head; the copy's heads as found there."""
    copied = []
    for head, new in zip(found, new_modules, strict=True):
        name = head.name
        old = ema_copy.get_submodule(name)
        twin = deepcopy(new)
        reference = next(old.parameters(), None)
        if reference is not None:
            twin.to(device=reference.device, dtype=reference.dtype)
            twin.requires_grad_(reference.requires_grad)
        parent, attr = parent_of(ema_copy, name)
        tx.hold([*old.parameters(), *old.buffers()])
        tx.set_attr(parent, attr, twin)
        copied.append(heads.Head(name, old, head.role))
    return copied


def _replace_twin(model: nn.Module, name: str, head: nn.Module, tx: Transaction) -> None:
    """Put a frozen copy of the new ``head`` at ``name``, the frozen original peft keeps
    beside a trained head copy (``modules_to_save``): with the adapters off the model
    then has the new class count too."""
    old = model.get_submodule(name)
    twin = deepcopy(head).requires_grad_(False)
    tx.hold([*old.parameters(), *old.buffers()])
    parent, attr = parent_of(model, name)
    tx.set_attr(parent, attr, twin)


def replace_head(
    target: BoundModel,
    root: nn.Module,
    root_name: str,
    options: ReplaceHeadOptions,
    tx: Transaction,
) -> Effect:
    """Replace the heads found in ``root`` (at ``root_name`` inside the model), and keep
    the model's class count and label map in step (:mod:`.model_config`);
    ``options.num_classes`` is resolved (never None)."""
    check_ema_owners(target)
    num_classes, dropout, labels = options.num_classes, options.dropout, options.labels
    assert num_classes is not None
    if num_classes < 1:
        raise TorchMagicError(
            f"the number of classes must be at least 1, got {num_classes}", param="num_classes"
        )
    if dropout is not None and not 0 <= dropout < 1:
        raise TorchMagicError(f"dropout must be in [0, 1), got {dropout}", param="dropout")
    where = None if root is target.model else root_name
    found = heads.locate(target.model, where, target.walked.modules)
    model_config.check_labels(target.model, found, num_classes, labels)
    located = [(h.name, h.module) for h in found]
    new_modules = [heads.build_head(module, num_classes, dropout) for _, module in located]
    tied = ties.find(target.model, [(n, m, True) for n, m in located], target.walked.sharing)
    shared = {id(t.param) for t in tied}  # the model keeps using them elsewhere
    old_params = [p for p in unique_parameters([m for _, m in located]) if id(p) not in shared]
    new_params = unique_parameters(new_modules)
    opt = target.optimizer
    again = _replaced_again(found, num_classes, opt, old_params)
    if opt is not None:
        joining, groupless = _head_groups(opt, [m for _, m in located], new_modules)
        head = head_group(target, exclude=old_params) or 0
        if groupless:
            check_new_group(target, opt, [head])
        scheduler_sync.snapshot(target.schedulers, opt, tx)
        editor = OptimizerEditor(opt, tx, target.model)
        editor.remove(old_params)
    # another optimizer holding the old head (or its home) gets the new one in its place
    other_heads = []
    for other in target.others:
        held_there = group_index(other.optimizer)
        if any(id(p) in held_there for p in old_params) or optimizer_sync.homed(
            other.optimizer, old_params
        ):
            other_joining, _ = _head_groups(other.optimizer, [m for _, m in located], new_modules)
            other_editor = OptimizerEditor(other.optimizer, tx, target.model)
            other_editor.remove([p for p in old_params if id(p) in held_there])
            other_heads.append((other_editor, other_joining))
    tx.hold([*old_params, *(b for _, m in located for b in m.buffers())])
    tx.trains_after_undo.extend(p for p in old_params if p.requires_grad)
    tx.stops_after_undo.extend(new_params)
    notes = []
    for (name, old), new in zip(located, new_modules, strict=True):
        carried = _carry_hooks(old, new)
        if carried:
            notes.append(f"{name}: its {carried} hook(s) now run on the new head")
        parent, attr = parent_of(target.model, name)
        tx.set_attr(parent, attr, new)
        twin = peft.original_of(target.model, name)
        if twin is not None:
            _replace_twin(target.model, twin, new, tx)
            notes.append(f"{twin}: peft's frozen original, now a frozen copy of the new head")
    synced = model_config.sync(target.model, found, num_classes, labels, tx)
    for path, ema_copy in target.ema_copies:
        copied = _copy_heads(ema_copy, found, new_modules, tx)
        model_config.sync(ema_copy, copied, num_classes, labels, tx)
        notes.append(f"EMA copy `{path}`: the same heads replaced (copies of the new ones)")
    if target.rebuilt is not None and opt is not None:
        notes.append(
            f"`{target.optimizer_name}`: {target.rebuilt}; the new head trains in the next "
            "one when configure_optimizers passes the module's parameters (edited here too)"
        )
    if opt is not None:
        for index, params in joining.items():
            editor.join(index, params)
        if groupless:
            check_lr(opt, opt.defaults["lr"])
            base = float(opt.defaults["lr"])
            index = editor.add_group(groupless, name=located[0][0], lr=base, template=opt.defaults)
            scheduler_sync.follow(target.schedulers, opt, index, head, base)
    for other_editor, other_joining in other_heads:
        for index, params in other_joining.items():
            other_editor.join(index, params)
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
    notes += [f"{t.describe()}: the new head has its own; that one stays as it is" for t in tied]
    return Effect(tuple(n for n, _ in located), _numel(new_params), 0, {}, (*again, *notes))


def _replaced_again(
    found: Sequence[heads.Head],
    num_classes: int,
    opt: torch.optim.Optimizer | None,
    old_params: Sequence[nn.Parameter],
) -> tuple[Advice, ...]:
    """The warning when the head had this shape already and has trained (the optimizer
    holds state for it): a re-run cell replaces a trained head with a fresh one."""
    head = found[0]
    trained = opt is not None and any(p in state_of(opt) for p in old_params)
    if head.out_features != num_classes or not trained:
        return ()
    shape = f"{head.in_features}→{head.out_features}"
    return (
        (
            f"{head.name} was already {shape} and trained: replaced again by a fresh one; ",
            Call("undo"),
            " restores it",
        ),
    )
