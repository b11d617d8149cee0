"""The one-line fine-tuning recipe, as the engine's own commands.

``Session.fine_tune`` is fastai's ``fine_tune``: freeze everything but the head, train
``freeze_epochs``, unfreeze every block with lrs spread geometrically from lr/100 (the
first block) to lr (the head), train ``epochs``. Each step is the session's own
``freeze`` / ``fit`` / ``unfreeze`` / ``fit`` call, so each is in the history and the
recipe equals those four commands typed by hand. The blocks are the model's top-level
children that hold parameters (descending through single wrappers such as a lone
``backbone``), in module order. ``bn`` is the freeze's BatchNorm policy for the head
phase (``"train"``: the frozen body's BatchNorm keeps training, fastai's ``train_bn``).

``schedule="one-cycle"`` gives each of the two runs a fresh ``OneCycleLR`` over the
user's optimizer, as fastai's ``fine_tune`` calls ``fit_one_cycle`` per phase: every
group's schedule peaks at its lr when the phase starts (its base lr: no other schedule
may be bound to the optimizer), starts at that / ``div`` and ends at that / 1e5 (fastai's
``div_final``), cosine both ways; the head phase warms up over 99 % of its steps (div
25), the unfrozen phase over 30 % (div 5). Momentum is not cycled (fastai cycles it
0.95→0.85→0.95): the optimizer's momentum and betas stay the user's. A phase counts
optimizer steps: epochs × ⌈batches / accumulate⌉. When a phase ends (finished or
stopped), each group's ``lr`` is its base lr again and the keys the schedule wrote into
the groups (``initial_lr``, ``max_lr``, ``min_lr``) are as before it: the optimizer is
the user's, ready for the next command, and its ``state_dict()`` works. Unlike fastai,
the unfrozen phase's top lr is not halved: ``lr`` says it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR

from ..surgery.results import Change
from .fit_events import FitHistory

FINAL_DIV = 1e5  # the last lr of a phase: base / FINAL_DIV (fastai's div_final)
# The keys OneCycleLR writes into each param group (momentum is not cycled).
_ONE_CYCLE_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
_ABSENT = object()


@dataclass(frozen=True)
class OneCyclePhase:
    """fastai's one-cycle conventions for one phase of the recipe."""

    pct_start: float  # the share of the phase's steps spent warming up
    div: float  # the first lr: base / div


HEAD_PHASE = OneCyclePhase(pct_start=0.99, div=25.0)
UNFROZEN_PHASE = OneCyclePhase(pct_start=0.3, div=5.0)


@contextmanager
def one_cycle_phase(
    optimizer: torch.optim.Optimizer, phase: OneCyclePhase, total_steps: int
) -> Iterator[OneCycleLR]:
    """A fresh OneCycleLR over every group, peaking at the group's lr now, for
    ``total_steps`` optimizer steps; afterwards (also on an error) every group's lr and
    schedule keys are as they were before it."""
    saved = [
        (group, {key: _copy(group.get(key, _ABSENT)) for key in _ONE_CYCLE_KEYS})
        for group in optimizer.param_groups
    ]
    try:
        yield OneCycleLR(
            optimizer,
            max_lr=[float(group["lr"]) for group in optimizer.param_groups],
            total_steps=total_steps,
            pct_start=phase.pct_start,
            div_factor=phase.div,
            final_div_factor=FINAL_DIV / phase.div,
            cycle_momentum=False,
        )
    finally:
        for group, values in saved:
            for key, value in values.items():
                live = group.get(key)
                if value is _ABSENT:
                    group.pop(key, None)
                elif isinstance(value, torch.Tensor) and isinstance(live, torch.Tensor):
                    with torch.no_grad():
                        live.copy_(value)  # a tensor lr is filled in place: keep the object
                else:
                    group[key] = value


def _copy(value: object) -> object:
    """A group value as it is now (torch schedulers fill tensor lrs in place)."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def fine_tune_blocks(model: nn.Module) -> tuple[str, ...]:
    """The blocks the recipe unfreezes: the first level below ``model`` (or below a chain
    of lone children) at which the parameters split over several children."""
    prefix, module = "", model
    while True:
        holders = [(n, c) for n, c in module.named_children() if any(True for _ in c.parameters())]
        if len(holders) != 1 or any(True for _ in module.parameters(recurse=False)):
            break
        name, module = holders[0]
        prefix = f"{prefix}{name}."
    if not holders:  # a lone leaf holds everything (or nothing does)
        return (prefix.rstrip("."),) if prefix else ()
    return tuple(f"{prefix}{name}" for name, _ in holders)


@dataclass(frozen=True)
class FineTuneResult:
    """The recipe's four steps; the last two are None when the head's run stopped early
    (interrupted, or a non-finite loss): the recipe does not go on after that."""

    model_name: str
    lr: float  # the top of the spread: the head's lr in the second run
    blocks: tuple[str, ...]
    freeze: Change
    head_fit: FitHistory
    unfreeze: Change | None = None
    full_fit: FitHistory | None = None
    schedule: str | None = None  # "one-cycle": a fresh OneCycleLR per phase
    bn: str | None = None  # the head phase's BatchNorm policy for the frozen body
