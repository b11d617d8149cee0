"""Keeping every LR scheduler bound to an optimizer in step with its param groups.

Schedulers hold per-group lists that torch zips against ``optimizer.param_groups`` with
``strict=True``; a new group needs an entry in each. A new group at lr X follows the same
schedule as a reference group, scaled by X / (reference group's current lr): closed-form
bases, cyclic bounds and plateau floors all scale, lambdas and momentum bounds are shared.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim import lr_scheduler as torch_schedulers

from ..errors import TorchMagicError
from .transaction import Transaction

SCHEDULER_TYPES = (torch_schedulers.LRScheduler, torch_schedulers.ReduceLROnPlateau)

# Per-group lists, and how a new group's entry derives from the reference group's entry.
_SCALED_LISTS = ("base_lrs", "max_lrs", "min_lrs")
_SHARED_LISTS = ("lr_lambdas", "base_momentums", "max_momentums")
_LAST_LR = "_last_lr"
_PER_GROUP_LISTS = (*_SCALED_LISTS, *_SHARED_LISTS, _LAST_LR)
_SCALED_KEYS = ("initial_lr", "max_lr", "min_lr")
_SHARED_KEYS = ("max_momentum", "base_momentum")


def is_scheduler(obj: object) -> bool:
    return isinstance(obj, SCHEDULER_TYPES)


def flatten(schedulers: Iterable[object]) -> list[object]:
    """Schedulers with the children of SequentialLR / ChainedScheduler, each once."""
    out: list[object] = []
    seen: set[int] = set()
    stack = list(schedulers)
    while stack:
        s = stack.pop(0)
        if id(s) in seen:
            continue
        seen.add(id(s))
        out.append(s)
        stack.extend(getattr(s, "_schedulers", ()))
    return out


def roots(schedulers: Iterable[object]) -> list[object]:
    """The schedulers a training loop steps itself: children of SequentialLR /
    ChainedScheduler are stepped by their parent."""
    schedulers = list(schedulers)
    children = {id(c) for s in schedulers for c in getattr(s, "_schedulers", ())}
    return [s for s in schedulers if id(s) not in children]


def bound_to(candidates: Iterable[object], optimizer: torch.optim.Optimizer) -> list[object]:
    """The schedulers among ``candidates`` (and their children) that drive ``optimizer``."""
    return [
        s
        for s in flatten(c for c in candidates if is_scheduler(c))
        if getattr(s, "optimizer", None) is optimizer
    ]


def _lists(scheduler: object) -> dict[str, list]:
    return {
        name: value
        for name in _PER_GROUP_LISTS
        if isinstance(value := getattr(scheduler, name, None), list)
    }


def mismatches(scheduler: object, optimizer: torch.optim.Optimizer) -> list[str]:
    """What in ``scheduler`` no longer lines up with ``optimizer``'s param groups: lists of
    the wrong length, schedule keys some groups lack. Empty when in step."""
    groups = optimizer.param_groups
    wrong = [
        f"{name} has {len(values)}"
        for name, values in _lists(scheduler).items()
        if name != _LAST_LR and len(values) != len(groups)
    ]
    keys = {k for g in groups for k in g if k in _SCALED_KEYS}
    wrong += [
        f"group {i} lacks '{k}'" for i, g in enumerate(groups) for k in sorted(keys) if k not in g
    ]
    return wrong


def check_followable(
    schedulers: Iterable[object], optimizer: torch.optim.Optimizer, ref: int
) -> None:
    """Refuse, before anything changes, when a new group could not follow the schedule."""
    n = len(optimizer.param_groups)
    for s in schedulers:
        kind = type(s).__name__
        problems = mismatches(s, optimizer)
        if problems:
            raise TorchMagicError(
                f"{kind}: {'; '.join(problems)} for {n} param groups: the scheduler is "
                "already out of step with the optimizer; recreate it first"
            )
        if not type(s).__module__.startswith("torch.optim"):
            unknown = [
                name
                for name, value in vars(s).items()
                if isinstance(value, list) and len(value) == n and name not in _PER_GROUP_LISTS
            ]
            if unknown:
                raise TorchMagicError(
                    f"{kind} keeps per-group list(s) {', '.join(unknown)} that torchmagic "
                    "cannot extend for a new param group; step it by hand or recreate it"
                )
    if schedulers and float(optimizer.param_groups[ref]["lr"]) <= 0:
        raise TorchMagicError(
            "the schedule has driven the learning rate to 0, so a new group cannot be placed "
            "on it at a given lr; recreate the scheduler after this change"
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


def follow(
    schedulers: Iterable[object], optimizer: torch.optim.Optimizer, index: int, ref: int
) -> None:
    """Give group ``index`` (new or reused) its entries, following group ``ref``.

    The group's current ``lr`` is already set; every schedule value scales by
    lr / ref lr, so the group trains at its lr now and moves by the same factors later.
    Group dicts are restored by the optimizer snapshot; lists by :func:`snapshot`.
    """
    groups = optimizer.param_groups
    group, ref_group = groups[index], groups[ref]
    scale = float(group["lr"]) / float(ref_group["lr"]) if float(ref_group["lr"]) else 1.0
    for key in _SCALED_KEYS:
        if key in ref_group:
            group[key] = ref_group[key] * scale
    for key in _SHARED_KEYS:
        if key in ref_group:
            group[key] = ref_group[key]
    for s in schedulers:
        for name, values in _lists(s).items():
            if name == _LAST_LR:
                setattr(s, name, [g["lr"] for g in groups])
                continue
            if name in _SCALED_LISTS:
                value = values[ref] * scale
            else:
                value = values[ref]
            if index == len(values):
                values.append(value)
            else:
                values[index] = value
