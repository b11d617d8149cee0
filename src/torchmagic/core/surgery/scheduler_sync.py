"""Keeping every LR scheduler bound to an optimizer in step with its param groups.

Schedulers keep per-group lists: torch zips them against ``optimizer.param_groups`` with
``strict=True`` (a missed list crashes later), timm zips without (a group with no entry
silently keeps a constant lr). A new group needs an entry in each.

A new group gets a *base lr*: the value its schedule scales (torch: ``initial_lr`` /
``base_lrs``; OneCycleLR and CyclicLR: the peak ``max_lr``; timm: ``base_values``). It
follows a reference group: every schedule value is the reference group's times
base / reference base, so its lr is the base times the schedule's present factor now and
at every later step, through restarts, warmups and cycles. Lambdas and momentum bounds are
shared. Without a scheduler (or under ReduceLROnPlateau) the factor is 1.

timm's ``Scheduler`` family is recognised by duck typing, so timm stays optional. Any
other object that holds the optimizer and keeps per-group lists cannot be followed:
commands that would add a param group refuse while it is bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Number

import torch
from torch.optim import lr_scheduler as torch_schedulers

from ..errors import TorchMagicError
from ..integrations.lookup import same
from .model_checks import check_lr
from .optimizer_sync import group_label
from .transaction import Transaction

SCHEDULER_TYPES = (torch_schedulers.LRScheduler, torch_schedulers.ReduceLROnPlateau)

# Per-group lists, and how a new group's entry derives from the reference group's entry.
_SCALED_LISTS = ("base_lrs", "max_lrs", "min_lrs")
_SHARED_LISTS = ("lr_lambdas", "base_momentums", "max_momentums")
_LAST_LR = "_last_lr"
_TIMM_BASES = "base_values"  # the base of the field the scheduler writes (``lr`` mostly)
_TIMM_WARMUP = "warmup_steps"  # per-group warmup increments towards the base
_TIMM_RESTORE = "restore_lr"  # lrs before noise was added (timm's plateau), or None
_PER_GROUP_LISTS = (
    *_SCALED_LISTS,
    *_SHARED_LISTS,
    _LAST_LR,
    _TIMM_BASES,
    _TIMM_WARMUP,
    _TIMM_RESTORE,
)
# timm list attributes that are not per group (milestones, noise window).
_NOT_PER_GROUP = ("decay_t", "noise_range_t")
_SCALED_KEYS = ("initial_lr", "max_lr", "min_lr", "swa_lr")  # swa_lr: torch's SWALR
_SHARED_KEYS = ("max_momentum", "base_momentum")


def is_timm_scheduler(obj: object) -> bool:
    """timm's ``Scheduler`` family, by its shape (timm is never imported)."""
    return (
        isinstance(getattr(obj, _TIMM_BASES, None), list)
        and isinstance(getattr(obj, "param_group_field", None), str)
        and callable(getattr(obj, "step_update", None))
    )


def is_scheduler(obj: object) -> bool:
    """A scheduler torchmagic can follow: torch's, or timm's."""
    return isinstance(obj, SCHEDULER_TYPES) or is_timm_scheduler(obj)


def _children(scheduler: object) -> list[object]:
    """SequentialLR / ChainedScheduler children, and the torch plateau scheduler inside
    timm's PlateauLRScheduler."""
    children = list(getattr(scheduler, "_schedulers", None) or ())
    inner = getattr(scheduler, "lr_scheduler", None)
    if is_scheduler(inner):
        children.append(inner)
    return children


def flatten(schedulers: Iterable[object]) -> list[object]:
    """Schedulers with their children, each once."""
    out: list[object] = []
    seen: set[int] = set()
    stack = list(schedulers)
    while stack:
        s = stack.pop(0)
        if id(s) in seen:
            continue
        seen.add(id(s))
        out.append(s)
        stack.extend(_children(s))
    return out


def roots(schedulers: Iterable[object]) -> list[object]:
    """The schedulers a training loop steps itself: children are stepped by their
    parent, and objects that only look like schedulers are not stepped at all."""
    schedulers = [s for s in schedulers if is_scheduler(s)]
    children = {id(c) for s in schedulers for c in _children(s)}
    return [s for s in schedulers if id(s) not in children]


def _is_number(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, Number) and not isinstance(value, bool)


def _attributes(obj: object) -> dict:
    try:
        return dict(vars(obj))
    except TypeError:  # no __dict__ (slots, builtins)
        return {}


def per_group_lists(obj: object, groups: int) -> list[str]:
    """Names of ``obj``'s list attributes holding one number or one function per param
    group: what a scheduler keeps per group."""
    return [
        name
        for name, value in _attributes(obj).items()
        if isinstance(value, list)
        and len(value) == groups
        and name not in _NOT_PER_GROUP
        and (all(_is_number(v) for v in value) or all(callable(v) for v in value))
    ]


def looks_like_scheduler(obj: object, optimizer: torch.optim.Optimizer) -> bool:
    """Not a scheduler torchmagic knows, but it holds ``optimizer``, can ``step()`` and
    keeps per-group lists: it would silently go out of step with a new group."""
    if is_scheduler(obj) or not callable(getattr(obj, "step", None)):
        return False
    if not any(same(v, optimizer) for v in _attributes(obj).values()):
        return False
    return bool(per_group_lists(obj, len(optimizer.param_groups)))


def bound_to(candidates: Iterable[object], optimizer: torch.optim.Optimizer) -> list[object]:
    """What among ``candidates`` drives ``optimizer``: its schedulers (with their children),
    then objects that look like schedulers of it. A scheduler built on a wrapper of
    ``optimizer`` (Accelerate's ``AcceleratedOptimizer``) drives it too."""
    candidates = list(candidates)
    found = [
        s
        for s in flatten(c for c in candidates if is_scheduler(c))
        if same(getattr(s, "optimizer", None), optimizer)
    ]
    seen = {id(s) for s in found}
    for c in candidates:
        if id(c) not in seen and looks_like_scheduler(c, optimizer):
            seen.add(id(c))
            found.append(c)
    return found


def _lists(scheduler: object) -> dict[str, list]:
    return {
        name: value
        for name in _PER_GROUP_LISTS
        if isinstance(value := getattr(scheduler, name, None), list)
    }


def _follows_lr(scheduler: object) -> bool:
    return not is_timm_scheduler(scheduler) or scheduler.param_group_field == "lr"  # type: ignore[attr-defined]


def base_lr(optimizer: torch.optim.Optimizer, schedulers: Iterable[object], index: int) -> float:
    """The base lr of param group ``index``: the value its schedule scales.

    OneCycleLR and CyclicLR: the peak (``max_lr``); timm: ``base_values`` (times the
    group's ``lr_scale``); other torch schedulers: ``base_lrs``. The first scheduler that
    defines one decides. Without one (or under ReduceLROnPlateau only): the lr now.
    """
    group = optimizer.param_groups[index]
    for s in flatten(schedulers):
        if isinstance(s, torch_schedulers.OneCycleLR) and "max_lr" in group:
            return float(group["max_lr"])
        if isinstance(s, torch_schedulers.CyclicLR) and index < len(s.max_lrs):
            return float(s.max_lrs[index])
        if is_timm_scheduler(s) and _follows_lr(s) and index < len(s.base_values):  # type: ignore[attr-defined]
            return float(s.base_values[index]) * float(group.get("lr_scale", 1.0))  # type: ignore[attr-defined]
        bases = getattr(s, "base_lrs", None)
        if (
            isinstance(s, torch_schedulers.LRScheduler)
            and not isinstance(s, torch_schedulers.ReduceLROnPlateau)
            and isinstance(bases, list)
            and index < len(bases)
        ):
            return float(bases[index])
    check_lr(optimizer, group["lr"])
    return float(group["lr"])


def schedule_name(schedulers: Iterable[object]) -> str | None:
    """The class of the scheduler the training loop steps (``SequentialLR``, not its
    children), for summaries: ``base 1e-4 · now 2.5e-6 (CosineAnnealingWarmRestarts)``."""
    stepped = roots(schedulers)
    return type(stepped[0]).__name__ if stepped else None


def mismatches(scheduler: object, optimizer: torch.optim.Optimizer) -> list[str]:
    """What in ``scheduler`` no longer lines up with ``optimizer``'s param groups: lists of
    the wrong length, schedule keys some groups lack. Empty when in step."""
    groups = optimizer.param_groups
    wrong = [
        f"{name} has {len(values)}"
        for name, values in _lists(scheduler).items()
        if name not in (_LAST_LR, _TIMM_RESTORE) and len(values) != len(groups)
    ]
    keys = {k for g in groups for k in g if k in _SCALED_KEYS}
    wrong += [
        f"group {i} lacks '{k}'" for i, g in enumerate(groups) for k in sorted(keys) if k not in g
    ]
    return wrong


def unfollowable(scheduler: object, optimizer: torch.optim.Optimizer) -> str | None:
    """Why a new param group could not follow ``scheduler``; None when it can."""
    if not is_scheduler(scheduler):
        lists = per_group_lists(scheduler, len(optimizer.param_groups))
        return (
            f"is not a torch or timm scheduler, and its per-group list(s) {', '.join(lists)} "
            "cannot be extended for a new param group"
        )
    if type(scheduler).__module__.startswith("torch.optim"):
        return None
    unknown = [
        name
        for name in per_group_lists(scheduler, len(optimizer.param_groups))
        if name not in _PER_GROUP_LISTS
    ]
    if unknown:
        return (
            f"keeps per-group list(s) {', '.join(unknown)} that torchmagic cannot extend "
            "for a new param group"
        )
    return None


def check_followable(
    schedulers: Iterable[object], optimizer: torch.optim.Optimizer, refs: Iterable[int]
) -> None:
    """Refuse, before anything changes, when a new group following the groups ``refs``
    could not be kept in step with every scheduler bound to ``optimizer``."""
    schedulers = list(schedulers)
    n = len(optimizer.param_groups)
    for s in schedulers:
        kind = type(s).__name__
        problems = mismatches(s, optimizer)
        if problems:
            raise TorchMagicError(
                f"{kind}: {'; '.join(problems)} for {n} param groups: the scheduler is "
                "already out of step with the optimizer; recreate it first"
            )
        reason = unfollowable(s, optimizer)
        if reason:
            raise TorchMagicError(
                f"{kind} (bound to the optimizer) {reason}; recreate it after this change, "
                "or step it by hand"
            )
    if not schedulers:
        return
    for ref in refs:
        if base_lr(optimizer, schedulers, ref) <= 0:
            label = group_label(optimizer.param_groups[ref], ref)
            raise TorchMagicError(
                f"param group {label} has base lr 0, so a new group cannot follow its "
                "schedule; give the group a base lr or recreate the scheduler",
                param="lr",
            )


def snapshot(
    schedulers: Iterable[object], optimizer: torch.optim.Optimizer, tx: Transaction
) -> None:
    """Record every per-group list so the command can be undone.

    Take it before the optimizer snapshot: inverses run newest first, so the groups are
    already restored when ``_last_lr`` is recomputed from them.
    """
    saved = [(s, {name: list(values) for name, values in _lists(s).items()}) for s in schedulers]

    def restore() -> None:
        lrs = [g["lr"] for g in optimizer.param_groups]
        for s, lists in saved:
            for name, values in lists.items():
                setattr(s, name, list(lrs) if name == _LAST_LR else values)

    tx.add(restore)


def _put(values: list, index: int, value: object) -> None:
    if index == len(values):
        values.append(value)
    else:
        values[index] = value


def _timm_entries(
    scheduler: object, lists: dict[str, list], group: dict, index: int, ref: int, base: float
) -> None:
    """Entries of a timm scheduler: its base (``base`` when it schedules the lr, else the
    group's own value of its field) and a warmup that reaches that base on time."""
    field = scheduler.param_group_field  # type: ignore[attr-defined]
    bases = lists[_TIMM_BASES]
    own = base / float(group.get("lr_scale", 1.0)) if field == "lr" else group[field]
    group[f"initial_{field}"] = own
    warmup = lists.get(_TIMM_WARMUP)
    warmup_t = getattr(scheduler, "warmup_t", 0)
    if warmup is not None:
        if warmup_t:
            start = getattr(scheduler, "warmup_lr_init", 0.0)
            ref_target = warmup[ref] * warmup_t + start
            target = ref_target / bases[ref] * own if bases[ref] else own
            _put(warmup, index, (target - start) / warmup_t)
        else:
            _put(warmup, index, warmup[ref])
    _put(bases, index, own)


def refresh_last_lrs(schedulers: Iterable[object], optimizer: torch.optim.Optimizer) -> None:
    """Each scheduler's ``_last_lr``: the groups' lrs now."""
    lrs = [g["lr"] for g in optimizer.param_groups]
    for s in schedulers:
        if isinstance(getattr(s, _LAST_LR, None), list):
            setattr(s, _LAST_LR, list(lrs))


def _like(reference: object, lr: float) -> object:
    """``lr`` as the reference group keeps its lr: a tensor where the optimizer was given
    a tensor lr (``Adam(lr=torch.tensor(1e-3))``), with its dtype and device."""
    if isinstance(reference, torch.Tensor):
        return torch.tensor(lr, dtype=reference.dtype, device=reference.device)
    return lr


def present_factor(
    optimizer: torch.optim.Optimizer, schedulers: Iterable[object], index: int
) -> float:
    """Where group ``index``'s schedule stands: its lr now over its base lr."""
    ref_base = base_lr(optimizer, list(schedulers), index)
    lr = optimizer.param_groups[index]["lr"]
    check_lr(optimizer, lr)
    return float(lr) / ref_base if ref_base else 1.0


def follow(
    schedulers: Iterable[object],
    optimizer: torch.optim.Optimizer,
    index: int,
    ref: int,
    base: float,
    refresh: bool = True,
    *,
    factor: float | None = None,
) -> None:
    """Give group ``index`` (new or reused) the base lr ``base``, following group ``ref``.

    Sets the group's lr now (``base`` × the reference group's present factor) and every
    schedule entry (the reference group's × base / reference base). Group dicts are
    restored by the optimizer snapshot; lists by :func:`snapshot`. ``refresh=False``
    leaves ``_last_lr`` to one :func:`refresh_last_lrs` after following many groups
    (each refresh reads every group). ``factor``: the reference's present factor, read
    before ``index`` was refilled when that is the reference itself (an emptied group
    taken back: its lr was just set, its schedule was not).
    """
    schedulers = list(schedulers)
    groups = optimizer.param_groups
    group, ref_group = groups[index], groups[ref]
    ref_base = base_lr(optimizer, schedulers, ref)
    if factor is None:
        factor = present_factor(optimizer, schedulers, ref)
    group["lr"] = _like(ref_group["lr"], base * factor)

    def scaled(value: object) -> object:
        return value / ref_base * base if ref_base else value  # type: ignore[operator]

    for key in _SCALED_KEYS:
        if key in ref_group:
            group[key] = scaled(ref_group[key])
    for key in _SHARED_KEYS:
        if key in ref_group:
            group[key] = ref_group[key]
    for s in schedulers:
        lists = _lists(s)
        if is_timm_scheduler(s) and _TIMM_BASES in lists:
            _timm_entries(s, lists, group, index, ref, base)
        for name, values in lists.items():
            if name in (_TIMM_BASES, _TIMM_WARMUP) and is_timm_scheduler(s):
                continue
            if name == _LAST_LR:
                if refresh:
                    setattr(s, name, [g["lr"] for g in groups])
            elif name == _TIMM_RESTORE:
                _put(values, index, group["lr"])
            elif name in _SCALED_LISTS:
                _put(values, index, scaled(values[ref]))
            else:
                _put(values, index, values[ref])
