"""When the training loop steps each scheduler: after every optimizer step or after every
epoch, decided per scheduler from what its schedule counts.

- per batch: OneCycleLR and CyclicLR (their ``total_steps`` / ``step_size_up`` count
  optimizer steps), LambdaLRs built by Hugging Face transformers' schedule helpers
  (``get_linear_schedule_with_warmup``…, recognised from their ``lr_lambda``'s module
  without importing transformers), timm schedulers with ``t_in_epochs=False``
  (``step_update(num_updates)``), and SequentialLR / ChainedScheduler holding any of these;
- per epoch: every other scheduler, timm schedulers with ``t_in_epochs=True``
  (``step(epoch)``);
- ReduceLROnPlateau: per epoch on the validation loss (the training loss without a
  validation loader), whatever the override says: it needs a loss, and a per-batch loss
  would cost a host sync per step.

``sched_step="batch"`` or ``"epoch"`` overrides the choice for every other scheduler.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

from torch.optim import lr_scheduler as torch_schedulers

from ..registry import REGISTRY

SchedStep = Literal["batch", "epoch"]
SCHED_STEPS: tuple[SchedStep, ...] = ("batch", "epoch")

_PER_BATCH_TYPES = (torch_schedulers.OneCycleLR, torch_schedulers.CyclicLR)
_TRANSFORMERS_SCHEDULES = "transformers.optimization"

# How far a timm clock is looked for from the lr (a schedule stepped by the user's loop):
# epochs, updates; never past the end of the schedule's cycles when it says where that is.
_CLOCK_SEARCH = {True: 10_000, False: 200_000}


@dataclass(frozen=True)
class ScheduleChoice:
    """How one scheduler is stepped in a run, and why (shown at the start of the run)."""

    name: str
    every: SchedStep
    reason: str


def is_timm_scheduler(scheduler: object) -> bool:
    """timm's ``Scheduler`` family, by duck typing (timm is optional)."""
    return (
        callable(getattr(scheduler, "step_update", None))
        and callable(getattr(scheduler, "step", None))
        and hasattr(scheduler, "t_in_epochs")
    )


def _is_transformers_lambda(scheduler: object) -> bool:
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not isinstance(scheduler, torch_schedulers.LambdaLR) or not lambdas:
        return False
    for fn in lambdas:
        while isinstance(fn, functools.partial):
            fn = fn.func
        if not getattr(fn, "__module__", "").startswith(_TRANSFORMERS_SCHEDULES):
            return False
    return True


def _natural(scheduler: object) -> tuple[SchedStep, str]:
    """The granularity a scheduler's schedule is written in, and why."""
    if is_timm_scheduler(scheduler):
        in_epochs = bool(scheduler.t_in_epochs)  # type: ignore[attr-defined]
        return ("epoch" if in_epochs else "batch"), f"t_in_epochs={in_epochs}"
    if isinstance(scheduler, _PER_BATCH_TYPES):
        return "batch", "counts optimizer steps"
    if _is_transformers_lambda(scheduler):
        return "batch", "a transformers schedule: counts optimizer steps"
    children = getattr(scheduler, "_schedulers", ())
    if any(_natural(child)[0] == "batch" for child in children):
        return "batch", "holds a per-step schedule"
    return "epoch", "default"


class _Stepper:
    """Steps one scheduler; ``every`` says when."""

    def __init__(self, scheduler: object, every: SchedStep) -> None:
        self.scheduler = scheduler
        self.every = every

    def advance(self, loss: float | None) -> None:
        self.scheduler.step()  # type: ignore[attr-defined]


class _PlateauStepper(_Stepper):
    """Only ever stepped per epoch, with a loss."""

    def advance(self, loss: float | None) -> None:
        self.scheduler.step(loss)  # type: ignore[attr-defined]


def _timm_at(scheduler: object, t: int) -> bool | None:
    """Whether the first param group's value is what the timm scheduler sets at ``t``
    (None: its values cannot be read, e.g. timm's plateau scheduler)."""
    try:
        values = scheduler._get_lr(t)  # type: ignore[attr-defined]
        group = scheduler.optimizer.param_groups[0]  # type: ignore[attr-defined]
        value = values[0] if isinstance(values, (list, tuple)) else values
        expected = float(value) * float(group.get("lr_scale", 1.0))
        now = float(group[scheduler.param_group_field])  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a scheduler whose values cannot be read here
        return None
    return math.isclose(now, expected, rel_tol=1e-9, abs_tol=1e-15)


def timm_clock(scheduler: object) -> tuple[int, str]:
    """The ``t`` a timm scheduler last set, and a note when it was read from the lr.

    timm schedulers keep no clock: the count torchmagic stepped it to is kept (in
    ``REGISTRY.timm_clocks``), but a schedule stepped by the user's own loop
    (``scheduler.step(epoch + 1)``) is found from the lr it set: the first ``t`` whose
    value is the first group's lr now. When neither fits (the lr was set by hand, noise),
    the count torchmagic knows (0 if none)."""
    known = REGISTRY.timm_clocks.get(scheduler)
    start = known if known is not None else 0
    here = _timm_at(scheduler, start)
    if here is None or here:
        return start, ""
    limit = _CLOCK_SEARCH[bool(scheduler.t_in_epochs)]  # type: ignore[attr-defined]
    length = getattr(scheduler, "get_cycle_length", None)
    if callable(length):
        end = int(length()) + int(getattr(scheduler, "warmup_t", 0) or 0) + 1
        limit = min(limit, end)
    for t in range(limit + 1):
        if t != start and _timm_at(scheduler, t):
            return t, f"continues at t={t} (read from its lr)"
    return start, ""


class _TimmStepper(_Stepper):
    """timm's ``t`` counts what the scheduler is stepped by: ``step(t)`` reads it as
    epochs when ``t_in_epochs``, ``step_update(t)`` as updates otherwise."""

    def __init__(self, scheduler: object, every: SchedStep, clock: int) -> None:
        super().__init__(scheduler, every)
        self.clock = clock

    def advance(self, loss: float | None) -> None:
        self.clock += 1
        t = REGISTRY.timm_clocks[self.scheduler] = self.clock
        if self.scheduler.t_in_epochs:  # type: ignore[attr-defined]
            self.scheduler.step(t, loss)  # type: ignore[attr-defined]
        else:
            self.scheduler.step_update(t)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class SchedulePlan:
    """Every scheduler of a run with when it is stepped."""

    per_batch: tuple[_Stepper, ...]
    per_epoch: tuple[_Stepper, ...]
    choices: tuple[ScheduleChoice, ...]

    def after_step(self) -> None:
        """After each optimizer step: no loss is passed (none is read per step)."""
        for stepper in self.per_batch:
            stepper.advance(None)

    def after_epoch(self, loss: float) -> None:
        """After each complete epoch, with the loss ReduceLROnPlateau reads."""
        for stepper in self.per_epoch:
            stepper.advance(loss)


def plan_schedules(schedulers: list, override: SchedStep | None) -> SchedulePlan:
    """Sort ``schedulers`` into per-batch and per-epoch steppers; ``override`` forces one
    granularity on all but ReduceLROnPlateau."""
    steppers: list[_Stepper] = []
    choices: list[ScheduleChoice] = []
    for scheduler in schedulers:
        name = type(scheduler).__name__
        if isinstance(scheduler, torch_schedulers.ReduceLROnPlateau):
            steppers.append(_PlateauStepper(scheduler, "epoch"))
            choices.append(ScheduleChoice(name, "epoch", "on the validation loss"))
            continue
        every, reason = _natural(scheduler)
        if override is not None:
            every, reason = override, f"sched_step={override!r}"
        if is_timm_scheduler(scheduler):
            clock, note = timm_clock(scheduler)
            reason = f"{reason}; {note}" if note else reason
            steppers.append(_TimmStepper(scheduler, every, clock))
        else:
            steppers.append(_Stepper(scheduler, every))
        choices.append(ScheduleChoice(name, every, reason))
    return SchedulePlan(
        per_batch=tuple(s for s in steppers if s.every == "batch"),
        per_epoch=tuple(s for s in steppers if s.every == "epoch"),
        choices=tuple(choices),
    )
