"""Setting param groups' base lrs on a live optimizer, every scheduler kept in step.

A group's base lr is the value its schedule scales (``initial_lr`` / ``base_lrs``;
OneCycleLR and CyclicLR: the peak ``max_lr``); without a schedule it is the lr itself.
Setting it to B multiplies every schedule value of that group — the lr now, the group
keys ``initial_lr`` / ``max_lr`` / ``min_lr``, the schedulers' ``base_lrs`` / ``max_lrs``
/ ``min_lrs`` entries — by B / old base, so the schedule's present factor is kept and the
group trains at B × factor now and at every later step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..errors import TorchMagicError
from . import scheduler_sync
from .edits import BoundModel
from .optimizer_sync import OptimizerEditor, group_label
from .results import Effect
from .transaction import Transaction


def base_lrs(optimizer: torch.optim.Optimizer, schedulers: Sequence[object]) -> list[float]:
    """Every group's base lr (its lr now where no schedule scales it)."""
    return [
        scheduler_sync.base_lr(optimizer, schedulers, i) for i in range(len(optimizer.param_groups))
    ]


def set_base_lrs(target: BoundModel, bases: Mapping[int, float], tx: Transaction) -> Effect:
    """Give the groups ``bases`` (index → new base lr); inverses go into ``tx``."""
    opt = target.optimizer
    if opt is None:
        raise TorchMagicError(
            f"no optimizer holds the parameters of '{target.model_name}'", param="optimizer"
        )
    old = base_lrs(opt, target.schedulers)
    for index, value in bases.items():
        if not 0 <= index < len(opt.param_groups):
            raise TorchMagicError(f"no param group {index}", param="group")
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            raise TorchMagicError(f"a base lr must be positive, got {value!r}", param="lr")
        if old[index] <= 0:
            label = group_label(opt.param_groups[index], index)
            raise TorchMagicError(
                f"param group {label} has base lr 0: there is no schedule to scale; set its "
                "lr on the optimizer or recreate the scheduler",
                param="lr",
            )
    problems = [p for s in target.schedulers for p in scheduler_sync.mismatches(s, opt)]
    if problems:
        raise TorchMagicError(
            f"a scheduler is out of step with the optimizer ({'; '.join(problems)}); "
            "recreate it first",
            param="schedulers",
        )
    scheduler_sync.snapshot(target.schedulers, opt, tx)
    OptimizerEditor(opt, tx, target.model)  # registers the groups' inverse
    for index, value in bases.items():  # a group following its own schedule at a new base
        scheduler_sync.follow(target.schedulers, opt, index, index, value)
    names = tuple(group_label(opt.param_groups[i], i) for i in bases)
    params = sum(p.numel() for i in bases for p in opt.param_groups[i]["params"])
    return Effect(names, params)
