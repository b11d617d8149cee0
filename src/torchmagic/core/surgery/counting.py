"""Counting parameters and describing param groups, shared by every result."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.optim import lr_scheduler as torch_schedulers

from ..modules import walk
from .optimizer_sync import group_label
from .results import Counts, GroupInfo
from .scheduler_sync import roots

GroupKey = tuple[int, tuple[int, ...], float, float | None]


def count(model: nn.Module) -> Counts:
    """Totals in one walk of the tree (tied parameters and shared buffers once)."""
    seen: set[int] = set()
    total = trainable = tensors = param_bytes = buffer_bytes = 0
    for module in walk(model):
        for p in module._parameters.values():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            n = p.numel()
            total += n
            tensors += 1
            param_bytes += n * p.element_size()
            if p.requires_grad:
                trainable += n
        for b in module._buffers.values():
            if b is not None and id(b) not in seen:
                seen.add(id(b))
                buffer_bytes += b.numel() * b.element_size()
    return Counts(total, trainable, tensors, param_bytes, buffer_bytes)


def group_key(group: dict) -> GroupKey:
    return (
        id(group),
        tuple(id(p) for p in group["params"]),
        group["lr"],
        group.get("weight_decay"),
    )


def group_keys(optimizer: torch.optim.Optimizer | None) -> dict[int, GroupKey]:
    """A cheap fingerprint of each group, to mark groups a command added or changed."""
    if optimizer is None:
        return {}
    return {id(g): group_key(g) for g in optimizer.param_groups}


def base_lr(group: dict, index: int, schedulers: Sequence[object]) -> float | None:
    """The lr the schedule scales for this group: ``initial_lr``, or the peak for
    OneCycleLR (group ``max_lr``) and CyclicLR (``max_lrs``). None without a schedule,
    and under ReduceLROnPlateau alone, where the lr now is the base."""
    scheduled = False
    for s in schedulers:
        if isinstance(s, torch_schedulers.OneCycleLR):
            return group.get("max_lr")
        if isinstance(s, torch_schedulers.CyclicLR):
            return float(s.max_lrs[index])
        scheduled = scheduled or not isinstance(s, torch_schedulers.ReduceLROnPlateau)
    return group.get("initial_lr") if scheduled else None


def describe_groups(
    optimizer: torch.optim.Optimizer | None,
    before: dict[int, GroupKey] | None = None,
    schedulers: Sequence[object] = (),
) -> tuple[GroupInfo, ...]:
    """Each group's lr now and base lr, weight decay, size, the schedulers stepping it
    (``schedulers``: those bound to ``optimizer``, children included) and, given the
    ``before`` fingerprints, whether the command added or changed it."""
    if optimizer is None:
        return ()
    stepped_by = tuple(type(s).__name__ for s in roots(schedulers))
    infos = []
    for i, g in enumerate(optimizer.param_groups):
        status = ""
        if before is not None:
            if id(g) not in before:
                status = "new"
            elif before[id(g)] != group_key(g):
                status = "changed"
        infos.append(
            GroupInfo(
                index=i,
                name=group_label(g, i),
                lr=float(g["lr"]),
                weight_decay=g.get("weight_decay"),
                tensors=len(g["params"]),
                numel=sum(p.numel() for p in g["params"]),
                status=status,
                base_lr=base_lr(g, i, schedulers),
                schedulers=stepped_by,
            )
        )
    return tuple(infos)
