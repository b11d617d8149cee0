"""The learning-rate range test: train on what is trainable now while the lr grows
exponentially from ``start`` to ``end``, record the loss, and put everything back.

Every param group's lr is scaled together: group g trains at lr × base_g / base_ref,
where base is each group's base lr (the value its schedule scales; the lr itself without
a schedule) and ref is the reference group — the head's group, the one holding the
model's last parameter in the optimizer, as for ``unfreeze``. The curve's lr is the
reference group's. The run stops early when the smoothed loss passes 4× its minimum or a
loss is not finite.

Suggestion (one rule, named in the result): the **steepest descent of the smoothed
loss** — the lr where the smoothed loss falls fastest per decade of lr (its slope taken
over ``steps / 20`` points each side, so step-to-step noise cancels), looked for after
the first steps (whose smoothing has little history) and before the smoothed minimum
(past it the loss is rising). The *falling range* is the stretch around that point over
which the smoothed loss keeps decreasing. No suggestion when the loss never falls.

Afterwards everything is as before, bit for bit: trainable weights and every buffer
(BatchNorm running statistics), every ``.grad`` (tensors and ``None``), the optimizer's
state (the same tensor objects, values restored) and every param group's
hyper-parameters, the GradScaler, the random state (torch CPU/CUDA, Python, NumPy, the
loader's own generators) and each module's train/eval flag. Schedulers are never
stepped. The copy lives on the host while the test runs: trainable weights, buffers,
gradients and optimizer state, once. Each loss is read right after its step (a host
sync per step): the test decides after every step whether to go on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter

import torch
from torch import nn

from ..errors import TorchMagicError
from ..integrations.lookup import state_of
from ..numbers import short
from ..rng import preserved_rng
from ..tensors import optimizer_params, unique
from .batch_loss import train_step
from .batch_sources import batch_source
from .counts import check_ceiling
from .fit_events import FitStart, StepInfo, discard_progress
from .fit_plan import FitPlan, check_plan
from .run_guards import ctrl_c_requests_stop, module_mode

SMOOTHING = 0.98  # weight of the past in the exponential moving average of the loss
DIVERGENCE = 4.0  # stop when the smoothed loss passes this multiple of its minimum
STEEPEST = "steepest descent of the smoothed loss"


@dataclass(frozen=True)
class LrFindResult:
    """The curve (reference group's lr per step, raw and smoothed losses) and what it
    suggests; ``applied`` is the history entry when the suggestion was applied."""

    model_name: str
    lrs: tuple[float, ...]
    losses: tuple[float, ...]
    smoothed: tuple[float, ...]
    suggestion: float | None
    rule: str
    falling: tuple[float, float] | None  # (from, to) lrs over which the smoothed loss falls
    reference_group: int
    reference_name: str
    ratios: tuple[float, ...]  # each group's base lr / the reference group's
    start: float
    end: float
    steps: int  # requested
    stopped: str | None = None  # why it ended before ``steps``, in words
    applied: object | None = None  # the session's Change when apply=True took effect
    schedulers: tuple[str, ...] = ()  # the bound schedulers (never stepped, left as they were)

    @property
    def min_lr(self) -> float | None:
        """The lr at the smoothed loss's minimum."""
        if not self.smoothed:
            return None
        return self.lrs[min(range(len(self.smoothed)), key=self.smoothed.__getitem__)]


def check_range(start: float, end: float, steps: int) -> None:
    for name, value in (("start", start), ("end", end)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (0 < value < math.inf)
        ):
            raise TorchMagicError(f"{name} must be a positive lr, got {value!r}", param=name)
    if start >= end:
        raise TorchMagicError(f"start ({start:g}) must be below end ({end:g})", param="start")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise TorchMagicError(f"steps must be an integer ≥ 2, got {steps!r}", param="steps")
    check_ceiling(steps, "steps")


# -- putting everything back -------------------------------------------------------------


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class _TrainingState:
    """Everything a few training steps can change, copied to the host; ``restore`` writes
    it back into the same tensor objects."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, amp) -> None:
        params = list(unique([*model.parameters(), *optimizer_params(optimizer)]))
        movable = [t for t in params if t.requires_grad] + list(unique(model.buffers()))
        self.tensors = [(t, _host_copy(t)) for t in movable]
        self.grads = [(p, p.grad, None if p.grad is None else _host_copy(p.grad)) for p in params]
        self.optimizer = optimizer
        self.state = {
            p: (
                dict(s),
                {k: _host_copy(v) for k, v in s.items() if isinstance(v, torch.Tensor)},
            )
            for p, s in state_of(optimizer).items()
        }
        self.groups = [dict(g) for g in optimizer.param_groups]
        self.opt_called = optimizer.__dict__.get("_opt_called", _MISSING)
        self.scaler = amp.scaler if amp.enabled else None
        self.scaler_state = self.scaler.state_dict() if self.scaler is not None else None

    def restore(self) -> None:
        with torch.no_grad():
            for live, saved in self.tensors:
                live.copy_(saved)
            for p, grad, grad_copy in self.grads:
                if grad is not None and grad_copy is not None:
                    grad.copy_(grad_copy)
                p.grad = grad
            state = state_of(self.optimizer)
            state.clear()
            for p, (entries, values) in self.state.items():
                for key, value in values.items():
                    entries[key].copy_(value)
                state[p] = entries
        for group, hyper in zip(self.optimizer.param_groups, self.groups, strict=True):
            group.clear()
            group.update(hyper)
        if self.opt_called is _MISSING:
            self.optimizer.__dict__.pop("_opt_called", None)
        else:
            self.optimizer._opt_called = self.opt_called  # type: ignore[attr-defined]
        if self.scaler is not None:
            self.scaler.load_state_dict(self.scaler_state)


_MISSING = object()


def _generators(loader: object) -> list[torch.Generator | None]:
    """The loader's own generators (its batch order draws from them)."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    return [
        getattr(loader, "generator", None),
        getattr(sampler, "generator", None),
        getattr(getattr(batch_sampler, "sampler", None), "generator", None),
    ]


@contextmanager
def restored_afterwards(plan: FitPlan) -> Iterator[None]:
    """Run a measurement on the live objects and leave them exactly as they were."""
    saved = _TrainingState(plan.model, plan.optimizer, plan.amp)
    with preserved_rng(_generators(plan.train)):
        try:
            with module_mode(plan.model, training=True):
                yield
        finally:
            saved.restore()


# -- the test ------------------------------------------------------------------------------


def _steepest(lrs: Sequence[float], smoothed: Sequence[float]) -> tuple[int, int, int] | None:
    """(steepest, first, last) indices: the steepest fall of the smoothed loss per decade
    of lr before its minimum, and the decreasing stretch around it."""
    n = len(smoothed)
    reach = max(1, n // 20)  # a slope over a few steps each side: noise cancels out
    skip = max(reach, min(10, n // 4))  # the first averages rest on few losses
    # the minimum after them too: one low early average is no minimum to stop before
    lowest = min(range(skip, n), key=smoothed.__getitem__) if n > skip else 0
    xs = [math.log10(v) for v in lrs]
    slopes = {
        i: (smoothed[i + reach] - smoothed[i - reach]) / (xs[i + reach] - xs[i - reach])
        for i in range(skip, min(lowest, n - 1 - reach) + 1)
    }
    if not slopes:
        return None
    best = min(slopes, key=slopes.__getitem__)
    if slopes[best] >= 0:
        return None
    first = best
    while first > 0 and smoothed[first - 1] > smoothed[first]:
        first -= 1
    last = best
    while last < n - 1 and smoothed[last + 1] < smoothed[last]:
        last += 1
    return best, first, last


def find_lr(
    plan: FitPlan,
    *,
    start: float,
    end: float,
    steps: int,
    reference: int,
    bases: Sequence[float],
) -> LrFindResult:
    """Run the range test on ``plan`` (its model, optimizer, loss, device, AMP policy and
    observer) with ``bases[g]`` the base lr of group g; everything is restored after."""
    check_range(start, end, steps)
    check_plan(plan)
    groups = plan.optimizer.param_groups
    ref_base = bases[reference]
    ratios = tuple(b / ref_base if ref_base > 0 else 1.0 for b in bases)
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    stopped = None
    observer = plan.observer
    interrupted: list[int] = []
    precision = plan.amp.status().dtype or "fp32"
    held = tuple(type(s).__name__ for s in plan.schedulers)
    # epochs 0: a run counted in steps (the loader is cycled), drawn without epochs
    observer.on_start(
        FitStart(plan.label, plan.model_name, 0, steps, precision, False, (), held=held)
    )
    observer_start = last_redraw = perf_counter()
    source = batch_source(plan)
    try:
        with restored_afterwards(plan), ctrl_c_requests_stop(lambda: interrupted.append(1)):
            average = 0.0
            step = 0
            while step < steps and stopped is None:
                batch_index = 0
                for forward, inputs, targets in source.batches(0):
                    lr = start * (end / start) ** (step / (steps - 1))
                    for group, ratio in zip(groups, ratios, strict=True):
                        group["lr"] = lr * ratio
                    loss = float(train_step(plan, forward, inputs, targets, first=step == 0))
                    step += 1
                    batch_index += 1
                    if not math.isfinite(loss):
                        stopped = f"the loss became {loss} at lr {short(lr)}"
                        break
                    average = SMOOTHING * average + (1 - SMOOTHING) * loss
                    value = average / (1 - SMOOTHING**step)
                    lrs.append(lr)
                    losses.append(loss)
                    smoothed.append(value)
                    if value > DIVERGENCE * min(smoothed) and step < steps:
                        stopped = (
                            f"the smoothed loss passed {DIVERGENCE:g}× its minimum "
                            f"at lr {short(lr)}"
                        )
                        break
                    if interrupted:
                        stopped = f"interrupted at step {step}"
                        break
                    now = perf_counter()
                    if now - last_redraw >= observer.refresh_seconds:
                        last_redraw = now
                        observer.on_step(
                            StepInfo(
                                1,
                                1,
                                step,
                                step,
                                steps,
                                step * len(targets) / (now - observer_start),
                                value,
                                tuple(g["lr"] for g in groups if g["params"]),
                            )
                        )
                    if step >= steps:
                        break
                if batch_index == 0:
                    raise TorchMagicError("the training data yields no batch", param="train")
    except TorchMagicError:
        if not lrs:
            discard_progress(observer)
        raise
    finally:
        observer.close()
    found = _steepest(lrs, smoothed)
    ref_group = groups[reference]
    return LrFindResult(
        model_name=plan.model_name,
        lrs=tuple(lrs),
        losses=tuple(losses),
        smoothed=tuple(smoothed),
        suggestion=None if found is None else lrs[found[0]],
        rule=STEEPEST,
        falling=None if found is None else (lrs[found[1]], lrs[found[2]]),
        reference_group=reference,
        reference_name=str(ref_group.get("name", reference)),
        ratios=ratios,
        start=float(start),
        end=float(end),
        steps=steps,
        stopped=stopped,
        schedulers=held,
    )
