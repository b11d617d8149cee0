"""The training loop behind ``Session.fit``: device moves, AMP, scheduler stepping (see
``schedule_steps``), live progress through an observer, clean stops on Ctrl-C and
non-finite losses, and the cached-feature path for linear probing.

No host sync per step. Each step's loss stays on the device; the loop reads the losses
of all steps since the last **check point** at once (one sync), where a check point comes
every ``CHECK_SECONDS`` of training at most (sooner when the observer redraws more often),
at each epoch end and when the run stops. So a non-finite loss at step k stops the run at
the first check point after it: at most ``CHECK_SECONDS`` of steps later, plus the step in
flight. On that stop:

- restored: BatchNorm running statistics (``running_mean``, ``running_var``,
  ``num_batches_tracked``), copied at each check point whose losses were all finite, go
  back to that copy; gradients are cleared (as on every exit);
- not restored: weights and optimizer state. The steps from k to the stop updated them
  (with a GradScaler, a step whose gradients are not finite is skipped and changes
  nothing); the stop message counts the parameter and optimizer-state tensors that now
  hold NaN/inf.

Gradient accumulation and clipping (``FitPlan.accumulate``, ``FitPlan.clip``; the
step itself is ``amp.Accumulation``): one optimizer step per ``accumulate`` loader
batches, each loss divided by ``accumulate``. A *step* is an optimizer step everywhere:
``max_steps``, the per-batch schedulers, the progress and the history count them. The
epoch's last, partial window steps on the batches it holds (as Lightning does; still
divided by ``accumulate``, so it moves less); a window cut by Ctrl-C is dropped, never
stepped. Losses are read at check points after an optimizer step.

Progressive unfreezing, early stop and keep-best (``FitPlan.pacing``) are decided in
``progressive`` after each epoch's validation; the unfreeze itself is the session's.

The history's ``data_wait_s`` adds up, per step, the time from asking for the next
batch to having its inputs and targets on the device (the copy is only enqueued when it
is non-blocking: no extra sync); on the cached-feature path only the loading counts.
``wall_s`` is the time of the training passes it is measured within (validation
excluded), so ``data_wait_s / wall_s`` is the share of training time spent waiting.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from time import perf_counter
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, IterableDataset

from ..errors import TorchMagicError
from ..modules import walk
from . import feature_cache
from .amp import Accumulation, AmpController, check_accumulate, check_clip
from .data import call_model, load_batch, next_epoch_indices, split_batch, to_device
from .progressive import BestWeights, Pacer, Pacing, Unfrozen, check_pacing
from .schedule_steps import SCHED_STEPS, SchedStep, ScheduleChoice, plan_schedules

LOSSES: dict[str, Callable] = {
    "cross_entropy": F.cross_entropy,
    "nll": F.nll_loss,
    "bce": F.binary_cross_entropy_with_logits,
    "mse": F.mse_loss,
    "l1": F.l1_loss,
    "smooth_l1": F.smooth_l1_loss,
    "huber": F.huber_loss,
}
CHECK_SECONDS = 0.5
# The data-wait clock. The loop's own clock (``perf_counter``) is read once per step and
# sets the check-point cadence; waiting is timed apart from it.
_wait_clock = time.perf_counter
# Callables that live in a namespace without the user defining them (``exit``,
# ``get_ipython``, ``print``…): never taken for a loss.
_NOT_USER_MODULES = ("builtins", "_sitebuiltins", "site", "IPython", "ipykernel")
_EMPTY = object()  # a loader or list with no batch at all


class StopReason(Enum):
    """Why a run ended before its last epoch."""

    MAX_STEPS = "max_steps"
    INTERRUPTED = "interrupted"
    NON_FINITE_LOSS = "non_finite_loss"
    EARLY_STOP = "early_stop"
    NO_METRIC = "no_metric"  # the monitored validation metric is not measured


@dataclass(frozen=True)
class FitStart:
    """What a run is about to do: sent to the observer before the first step."""

    label: str
    model_name: str
    epochs: int  # 0: a run counted in steps only (lr_find)
    max_steps: int | None
    precision: str
    cached_features: bool
    schedules: tuple[ScheduleChoice, ...]
    accumulate: int = 1  # loader batches per optimizer step
    clip: float | None = None  # the largest total gradient norm
    held: tuple[str, ...] = ()  # schedulers bound to the optimizer that the run never steps


@dataclass(frozen=True)
class StepInfo:
    """A progress snapshot: sent to the observer at most every ``refresh_seconds``.
    Steps are optimizer steps: ``batch`` of ``batches`` counts this epoch's (one per
    ``accumulate`` loader batches), ``step`` the run's."""

    epoch: int
    epochs: int
    step: int
    batch: int
    batches: int | None
    samples_per_s: float
    loss: float
    lrs: tuple[float, ...]
    data_wait: float | None = None  # share of this epoch's time so far spent waiting for batches
    groups: tuple[str, ...] = ()  # the names of the groups ``lrs`` belong to


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch; ``lrs`` are those its last step trained at."""

    epoch: int
    train_loss: float
    val_loss: float | None
    val_accuracy: float | None
    samples: int
    seconds: float
    lrs: tuple[float, ...]
    groups: tuple[str, ...] = ()  # the names of the groups ``lrs`` belong to


@dataclass(frozen=True)
class FitHistory:
    """One fit run: per-epoch metrics and how it ended."""

    label: str
    model_name: str
    epochs: tuple[EpochMetrics, ...]
    steps: int
    samples: int
    seconds: float
    stopped: str | None = None  # why it ended early, in words; None when it ran to the end
    cached_features: bool = False
    precision: str = "fp32"
    stop_reason: StopReason | None = None
    schedules: tuple[ScheduleChoice, ...] = ()
    unfreezes: tuple[Unfrozen, ...] = ()  # (epoch, block, base lr) of each progressive unfreeze
    best_epoch: int | None = None  # keep_best: the epoch whose weights the model holds now
    data_wait_s: float = 0.0  # waiting for batches (see the module docstring)
    wall_s: float = 0.0  # the training passes' time, validation excluded
    accumulate: int = 1  # loader batches per optimizer step (``steps`` counts these steps)
    clip: float | None = None  # the largest total gradient norm

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def data_wait_share(self) -> float | None:
        return self.data_wait_s / self.wall_s if self.wall_s > 0 else None


class FitObserver(Protocol):
    refresh_seconds: float

    def on_start(self, start: FitStart) -> None: ...

    def on_step(self, info: StepInfo) -> None: ...

    def on_validation_start(self, epoch: int, batches: int | None) -> None: ...

    def on_epoch(self, metrics: EpochMetrics) -> None: ...

    def on_unfreeze(self, event: Unfrozen) -> None: ...

    def close(self) -> None: ...


def discard_progress(observer: FitObserver) -> None:
    """A run refused at its first step leaves no progress behind (the refusal is the one
    line shown); ``discard`` is optional for observers."""
    discard = getattr(observer, "discard", None)
    if discard is not None:
        discard()


class _Silent:
    refresh_seconds = float("inf")

    def on_start(self, start: FitStart) -> None:
        pass

    def on_step(self, info: StepInfo) -> None:
        pass

    def on_validation_start(self, epoch: int, batches: int | None) -> None:
        pass

    def on_epoch(self, metrics: EpochMetrics) -> None:
        pass

    def on_unfreeze(self, event: Unfrozen) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class FitPlan:
    """Everything one run needs, resolved by the session and checked by ``fit``."""

    model: nn.Module
    model_name: str
    optimizer: torch.optim.Optimizer
    schedulers: list
    loss_fn: Callable
    device: torch.device
    amp: AmpController
    train: Iterable
    val: Iterable | None = None
    epochs: int = 1
    max_steps: int | None = None
    cache_features: bool = False
    sched_step: SchedStep | None = None
    label: str = ""
    observer: FitObserver = field(default_factory=_Silent)
    pacing: Pacing | None = None
    accumulate: int = 1  # loader batches per optimizer step
    clip: float | None = None  # clip the total gradient norm to this before each step

    def batch_source(self) -> _LoaderBatches | _CachedFeatureBatches:
        """Where the run's batches come from: the loader through the whole model, or
        (``cache_features``) the head on stored backbone features."""
        return _CachedFeatureBatches(self) if self.cache_features else _LoaderBatches(self)


def _user_defined(value: object) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module.partition(".")[0] not in _NOT_USER_MODULES


def resolve_loss(name: str | Callable, namespace: Mapping[str, object]) -> Callable:
    """A loss by name (``cross_entropy``, ``mse``…), a callable the user bound to a
    variable (a function, ``nn.CrossEntropyLoss()``…), or, from Python, that callable."""
    if not isinstance(name, str):
        if isinstance(name, type) or not callable(name):
            raise TorchMagicError(
                f"loss must be a name or a loss function, got the {type(name).__name__} "
                f"{name!r}" + (" (a class: pass an instance)" if isinstance(name, type) else ""),
                param="loss",
            )
        return name
    if name in LOSSES:
        return LOSSES[name]
    value = None if name.startswith("_") else namespace.get(name)
    if isinstance(value, type):
        raise TorchMagicError(
            f"loss '{name}' is a class: bind an instance, e.g. criterion = {name}()",
            param="loss",
        )
    if callable(value) and _user_defined(value):
        return value
    raise TorchMagicError(
        f"unknown loss '{name}': use one of {', '.join(LOSSES)} or the name of a loss "
        "function you defined",
        param="loss",
    )


# -- checks before any step --------------------------------------------------------------


def _first_batch(data: Iterable) -> object | None:
    """The first batch when it can be read without iterating (a list, or a loader over
    a map-style dataset: its first sample, collated); None when it cannot."""
    if isinstance(data, DataLoader):
        dataset = data.dataset
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            return None
        return load_batch(data, [0]) if len(dataset) else _EMPTY
    if isinstance(data, Sequence):
        return data[0] if len(data) else _EMPTY
    return None


def _check_batches(data: object, param: str) -> None:
    if isinstance(data, (torch.Tensor, str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise TorchMagicError(
            f"{param} must be a DataLoader or another iterable of (inputs, targets) batches, "
            f"not a {type(data).__name__}",
            param=param,
        )
    first = _first_batch(data)
    if first is _EMPTY:
        raise TorchMagicError(f"{param} has no batches", param=param)
    if first is not None:
        split_batch(first, param)


def check_plan(plan: FitPlan) -> None:
    """Refuse a plan that cannot train, before anything changes."""
    if plan.epochs < 1:
        raise TorchMagicError(f"epochs must be at least 1, got {plan.epochs}", param="epochs")
    if plan.max_steps is not None and plan.max_steps < 1:
        raise TorchMagicError(
            f"max_steps must be at least 1, got {plan.max_steps}", param="max_steps"
        )
    if plan.sched_step is not None and plan.sched_step not in SCHED_STEPS:
        raise TorchMagicError(
            f"sched_step must be 'batch', 'epoch' or None, got {plan.sched_step!r}",
            param="sched_step",
        )
    check_accumulate(plan.accumulate)
    check_clip(plan.clip)
    _check_batches(plan.train, "train")
    if plan.val is not None:
        _check_batches(plan.val, "val")
    if plan.pacing is not None:
        check_pacing(plan.pacing, plan.val is not None, plan.cache_features)
    if not any(p.requires_grad for p in plan.model.parameters()):
        raise TorchMagicError(
            f"nothing to train: every parameter of `{plan.model_name}` is frozen "
            "(unfreeze a block first)",
            param="model",
        )


# -- pieces of the loop ------------------------------------------------------------------


@contextmanager
def _mode(module: nn.Module, training: bool) -> Iterator[None]:
    """``module`` in train or eval mode; every submodule's own flag back afterwards."""
    flags = [(m, m.training) for m in walk(module)]
    module.train(training)
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextmanager
def _ctrl_c_requests_stop(request_stop: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C calls ``request_stop`` instead of raising mid-step, so the loop stops
    between batches."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: request_stop())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _accuracy_hits(output: Any, targets: torch.Tensor) -> torch.Tensor | None:
    if (
        isinstance(output, torch.Tensor)
        and output.ndim == 2
        and targets.ndim == 1
        and not targets.is_floating_point()
    ):
        return (output.argmax(dim=1) == targets).sum()
    return None


def _score(pairs: Iterable[tuple[Any, torch.Tensor]], loss_fn: Callable):
    """(mean loss, accuracy or None) over (output, targets) pairs, summed on the device
    and read once at the end."""
    total: torch.Tensor | float = 0.0
    hits: torch.Tensor | int = 0
    seen, counted = 0, True
    for output, targets in pairs:
        total = total + loss_fn(output, targets).detach().float() * len(targets)
        batch_hits = _accuracy_hits(output, targets) if counted else None
        if batch_hits is None:
            counted = False
        else:
            hits = hits + batch_hits
        seen += len(targets)
    if not seen:
        return None, None
    return float(total) / seen, (float(hits) / seen if counted else None)


def _main_output(output: Any) -> Any:
    """torchvision's GoogLeNet/Inception return namedtuples in train mode: use ``.logits``."""
    return getattr(output, "logits", output)


def _length(data: Iterable) -> int | None:
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:
        return None


def _non_blocking(loader: Iterable, device: torch.device) -> bool:
    return bool(getattr(loader, "pin_memory", False)) and device.type == "cuda"


Batch = tuple[Callable[[Any], Any], Any, torch.Tensor]  # (forward, inputs, targets)


class _LoaderBatches:
    """Batches from the loader, moved to the device, through the whole model."""

    cached = False

    def __init__(self, plan: FitPlan) -> None:
        self.plan = plan
        self.wait_s = 0.0  # asking for a batch → inputs and targets on the device

    def batches(self, epoch: int) -> Iterator[Batch]:
        plan = self.plan
        non_blocking = _non_blocking(plan.train, plan.device)
        loader = iter(plan.train)
        while True:
            start = _wait_clock()
            try:
                batch = next(loader)
            except StopIteration:
                return
            inputs, targets = split_batch(batch, "train")
            inputs = to_device(inputs, plan.device, non_blocking)
            targets = to_device(targets, plan.device, non_blocking)
            self.wait_s += _wait_clock() - start
            yield plan.model, inputs, targets

    def validate(self) -> tuple[float | None, float | None]:
        plan = self.plan
        if plan.val is None:
            return None, None
        non_blocking = _non_blocking(plan.val, plan.device)

        def pairs() -> Iterator[tuple[Any, torch.Tensor]]:
            for batch in plan.val:  # type: ignore[union-attr]
                inputs, targets = split_batch(batch, "val")
                inputs = to_device(inputs, plan.device, non_blocking)
                with plan.amp.autocast():
                    output = _main_output(call_model(plan.model, inputs))
                yield output, to_device(targets, plan.device, non_blocking)

        with _mode(plan.model, training=False), torch.no_grad():
            return _score(pairs(), plan.loss_fn)


class _CachedFeatureBatches:
    """The head on stored backbone features: the first epoch fills the store while
    training the head on the features just computed; later epochs read the store.
    Refuses (on construction, before any step) unless the features are the same every
    epoch."""

    cached = True

    def __init__(self, plan: FitPlan) -> None:
        self.plan = plan
        loaders = [plan.train] + ([plan.val] if plan.val is not None else [])
        self.head = feature_cache.check_cacheable(plan.model, loaders)  # type: ignore[arg-type]
        self.store = feature_cache.FeatureStore(len(plan.train.dataset), plan.device)  # type: ignore[attr-defined]
        self.checked = False
        self.val_features: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.wait_s = 0.0  # loading only: the backbone's forward on the first pass is not waiting

    def _features(self, inputs: Any) -> tuple[torch.Tensor, Any]:
        plan = self.plan
        with _mode(plan.model, training=False), torch.no_grad(), plan.amp.autocast():
            return feature_cache.capture_head_input(plan.model, self.head.module, inputs)

    def _first_pass(self, indices: list[int]) -> Batch:
        plan = self.plan
        start = _wait_clock()
        inputs, targets = split_batch(load_batch(plan.train, indices), "train")  # type: ignore[arg-type]
        inputs = to_device(inputs, plan.device, False)
        targets = to_device(targets, plan.device, False)
        self.wait_s += _wait_clock() - start
        feats, output = self._features(inputs)
        if not self.checked:
            with _mode(self.head.module, training=False), torch.no_grad(), plan.amp.autocast():
                again = _main_output(self.head.module(feats))
            if not torch.allclose(again.float(), _main_output(output).float(), atol=1e-5):
                raise TorchMagicError(
                    f"cache_features: the model does more after its head ({self.head.name}); "
                    "its output is not head(features)",
                    param="cache_features",
                )
            self.checked = True
        self.store.put(indices, feats, targets)
        return self.head.module, feats, targets

    def batches(self, epoch: int) -> Iterator[Batch]:
        for indices in next_epoch_indices(self.plan.train):  # type: ignore[arg-type]
            if epoch == 0:
                yield self._first_pass(indices)
            else:
                start = _wait_clock()
                feats, targets = self.store.get(indices)
                self.wait_s += _wait_clock() - start
                yield self.head.module, feats, targets

    def validate(self) -> tuple[float | None, float | None]:
        plan = self.plan
        if plan.val is None:
            return None, None
        if self.val_features is not None:
            # the uncached run would iterate the loader: draw the same random numbers
            next_epoch_indices(plan.val)  # type: ignore[arg-type]
        else:
            self.val_features = []
            for batch in plan.val:
                inputs, targets = split_batch(batch, "val")
                feats, _ = self._features(to_device(inputs, plan.device, False))
                self.val_features.append((feats, to_device(targets, plan.device, False)))
        head = self.head.module
        with _mode(head, training=False), torch.no_grad(), plan.amp.autocast():
            pairs = ((_main_output(head(f)), t) for f, t in self.val_features)
            return _score(pairs, plan.loss_fn)


class _LossLedger:
    """Each step's loss stays on the device until a check point reads all of them with
    one host sync; the epoch's loss adds up the finite steps before the first bad one."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, torch.Tensor, int]] = []  # (step, loss, samples)
        self.total = 0.0
        self.seen = 0

    def start_epoch(self) -> None:
        self.total, self.seen = 0.0, 0

    def add(self, step: int, loss: torch.Tensor, samples: int) -> None:
        """One batch's loss, for the optimizer step ``step`` it is part of."""
        self.pending.append((step, loss, samples))

    def settle(self) -> tuple[int, float] | None:
        """(step, loss) of the first non-finite loss since the last check, else None."""
        if not self.pending:
            return None
        values = torch.stack([loss.float() for _, loss, _ in self.pending]).tolist()
        pending = [(step, n) for step, _, n in self.pending]
        self.pending.clear()
        for (step, n), value in zip(pending, values, strict=True):
            if value != value or value in (float("inf"), float("-inf")):
                return step, value
            self.total += value * n
            self.seen += n
        return None

    @property
    def epoch_loss(self) -> float:
        return self.total / self.seen if self.seen else float("nan")


class _BatchNormSnapshot:
    """The running statistics of every BatchNorm as they were at the last check point
    whose losses were all finite, and before the batch in flight (a few KB to MB each:
    copied on the device): a step that raises leaves no statistics of its batch."""

    def __init__(self, model: nn.Module) -> None:
        self.live = [
            buffer
            for m in walk(model)
            if isinstance(m, _BatchNorm) and m.track_running_stats
            for buffer in m.buffers(recurse=False)
        ]
        self.saved = [b.detach().clone() for b in self.live]
        self.before_batch = [b.detach().clone() for b in self.live]
        self.step = 0

    def take(self, step: int) -> None:
        if self.live:
            torch._foreach_copy_(self.saved, self.live)
        self.step = step

    def restore(self) -> None:
        if self.live:
            with torch.no_grad():
                torch._foreach_copy_(self.live, self.saved)

    def take_batch(self) -> None:
        if self.live:
            torch._foreach_copy_(self.before_batch, self.live)

    def restore_batch(self) -> None:
        if self.live:
            with torch.no_grad():
                torch._foreach_copy_(self.live, self.before_batch)


def _count_non_finite(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    """(tensors holding NaN/inf, tensors looked at): read once, at a stop."""
    checked = [t for t in tensors if t.is_floating_point()]
    return sum(not bool(torch.isfinite(t).all()) for t in checked), len(checked)


def _clear_grads(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    for p in model.parameters():
        p.grad = None


def _shape_of(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _loss_of(plan: FitPlan, output: Any, targets: Any, first: bool) -> torch.Tensor:
    """The loss of one batch. On the first step a loss that cannot take the model's
    outputs and the batch's targets is refused in one line (nothing has trained yet);
    a loss that is not one number is refused at any step (backward needs a scalar)."""
    try:
        loss = plan.loss_fn(output, targets)
    except (TorchMagicError, torch.OutOfMemoryError):  # already one line; not the loss's
        raise
    except (TypeError, ValueError, RuntimeError, IndexError, AttributeError) as error:
        if not first:
            raise
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise TorchMagicError(
            f"the loss fails on the first batch (outputs: {_shape_of(output)}, targets: "
            f"{_shape_of(targets)}): {type(error).__name__}" + (f": {text}" if text else ""),
            param="loss",
        ) from error
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TorchMagicError(
            f"the loss must return one number (a tensor with one element), got {_shape_of(loss)}",
            param="loss",
        )
    return loss


def forward_loss(
    plan: FitPlan,
    forward: Callable[[Any], Any],
    inputs: Any,
    targets: torch.Tensor,
    first: bool = False,
) -> torch.Tensor:
    """The batch's loss under the plan's AMP policy (autocast covers forward and loss);
    ``first``: the run's first batch, where a loss that does not fit is a refusal (see
    :func:`_loss_of`)."""
    with plan.amp.autocast():
        output = _main_output(call_model(forward, inputs))
        return _loss_of(plan, output, targets, first)


def train_step(
    plan: FitPlan,
    forward: Callable[[Any], Any],
    inputs: Any,
    targets: torch.Tensor,
    first: bool = False,
) -> torch.Tensor:
    """One optimizer step on one batch (no accumulation, no clipping: the lr range test's
    step); the loss stays on the device (reading it is the caller's choice: a host sync).
    ``first``: the run's first step (see :func:`forward_loss`)."""
    loss = forward_loss(plan, forward, inputs, targets, first)
    plan.amp.step(loss, plan.optimizer)
    return loss.detach()


@dataclass(frozen=True)
class _EpochRun:
    samples: int
    seconds: float
    complete: bool  # every batch of the epoch trained


class _Trainer:
    def __init__(self, plan: FitPlan) -> None:
        self.plan = plan
        self.source = plan.batch_source()
        self.schedule = plan_schedules(plan.schedulers, plan.sched_step)
        self.batches_per_epoch = _length(plan.train)
        self.window = Accumulation(plan.accumulate, plan.clip)
        self.steps_per_epoch = (
            None
            if self.batches_per_epoch is None
            else math.ceil(self.batches_per_epoch / plan.accumulate)
        )
        self.check_seconds = min(plan.observer.refresh_seconds, CHECK_SECONDS)
        self.ledger = _LossLedger()
        self.batchnorm = _BatchNormSnapshot(plan.model)
        self.steps = 0
        self.samples = 0
        self.interrupt_requested = False
        self.stop: StopReason | None = None
        self.stop_message: str | None = None
        self.trained_lrs = self._group_lrs()
        self.pacer = Pacer(plan.pacing) if plan.pacing is not None else None
        keep_best = plan.pacing is not None and plan.pacing.keep_best
        self.best = BestWeights(plan.model) if keep_best else None
        self.train_seconds = 0.0

    def _group_lrs(self) -> list[Any]:
        """The lrs of non-empty groups, as stored (a tensor lr is not read here)."""
        return [g["lr"] for g in self.plan.optimizer.param_groups if g["params"]]

    def _group_names(self) -> tuple[str, ...]:
        """The names of the groups :meth:`_group_lrs` reads, in the same order."""
        groups = self.plan.optimizer.param_groups
        return tuple(str(g.get("name", f"group {i}")) for i, g in enumerate(groups) if g["params"])

    def _request_interrupt(self) -> None:
        self.interrupt_requested = True

    def _stopping(self, reason: StopReason, message: str) -> None:
        self.stop, self.stop_message = reason, message

    # -- one batch, one optimizer step per window --------------------------------------

    def _batch(self, forward: Callable[[Any], Any], inputs: Any, targets: torch.Tensor) -> bool:
        """Backpropagate one batch into the window; returns whether it closed the window
        (an optimizer step). A batch that raises leaves no BatchNorm statistics of the
        window it was in (none of its batches stepped)."""
        plan = self.plan
        first = self.steps == 0 and not self.window.pending
        if not self.window.pending:
            self.batchnorm.take_batch()
        try:
            loss = forward_loss(plan, forward, inputs, targets, first)
            self.ledger.add(self.steps + 1, loss.detach(), len(targets))
            self.window.add(loss, plan.optimizer, plan.amp.active_scaler)
        except BaseException:  # the window's forwards may have moved the statistics
            self.batchnorm.restore_batch()
            raise
        if self.window.pending:
            return False
        self._stepped()
        return True

    def _close_window(self) -> None:
        """The epoch's last, partial window: step on what it holds."""
        self.window.close(self.plan.optimizer, self.plan.amp.active_scaler)
        self._stepped()

    def _stepped(self) -> None:
        self.steps += 1
        self.trained_lrs = self._group_lrs()
        self.schedule.after_step()

    def _at_max_steps(self) -> bool:
        """Whether the run has made ``max_steps`` optimizer steps (then it stops)."""
        max_steps = self.plan.max_steps
        if max_steps is None or self.steps < max_steps:
            return False
        self._stopping(StopReason.MAX_STEPS, f"reached max_steps={max_steps}")
        return True

    def _interrupted(self, epoch: int, batch_index: int, complete: bool) -> str:
        """What a Ctrl-C stopped: the last step, the batches of an open window it dropped,
        and the epoch it cut (none right after an epoch's last step)."""
        dropped = self.window.pending
        held = (
            f" (the {dropped} batch{'es' if dropped != 1 else ''} accumulated since were dropped)"
            if dropped
            else ""
        )
        cut = ""
        if batch_index and not complete:
            of = f" of {self.batches_per_epoch}" if self.batches_per_epoch else ""
            cut = f"; epoch {epoch + 1} was cut after {batch_index}{of} batches"
        return f"interrupted; the last completed step is {self.steps}{held}{cut}"

    # -- check points ----------------------------------------------------------------

    def _check(self) -> bool:
        """Read the losses since the last check; on a non-finite one, stop and restore
        what can be restored. Returns whether training may go on."""
        bad = self.ledger.settle()
        if bad is None:
            self.batchnorm.take(self.steps)
            return True
        self._stop_on_non_finite(*bad)
        return False

    def _stop_on_non_finite(self, step: int, value: float) -> None:
        plan = self.plan
        self.batchnorm.restore()
        params = [p for p in plan.model.parameters() if p.requires_grad]
        bad_params, n_params = _count_non_finite(params)
        state = [
            t
            for s in plan.optimizer.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        ]
        bad_state, _ = _count_non_finite(state)
        parts = [
            f"the loss became {value} at step {step}; stopped after step {self.steps} "
            f"(losses are read every {self.check_seconds:g} s and at each epoch end)"
        ]
        if self.batchnorm.live:
            parts.append(f"BatchNorm running statistics restored to step {self.batchnorm.step}")
        if bad_params or bad_state:
            parts.append(
                f"{bad_params} of {n_params} trainable parameter tensors and {bad_state} "
                f"optimizer state tensors hold NaN/inf since step {step}: reload them from "
                "a checkpoint"
            )
        else:
            scaler = " (the GradScaler skipped the non-finite steps)" if plan.amp.scaler else ""
            parts.append(f"weights and optimizer state are finite{scaler}")
        self._stopping(StopReason.NON_FINITE_LOSS, "; ".join(parts))

    # -- epochs ----------------------------------------------------------------------

    def _train_epoch(self, epoch: int) -> _EpochRun:
        plan = self.plan
        self.ledger.start_epoch()
        samples = batch_index = epoch_steps = 0
        complete = False
        start = last_check = last_redraw = perf_counter()
        waited_before = self.source.wait_s
        iterator = self.source.batches(epoch)
        while True:
            if self.interrupt_requested:  # Ctrl-C during the last step or the validation
                # right after an epoch's last batch (its window stepped) the epoch is whole:
                # its schedulers step
                complete = 0 < batch_index == self.batches_per_epoch and not self.window.pending
                self._stopping(
                    StopReason.INTERRUPTED, self._interrupted(epoch, batch_index, complete)
                )
                break
            try:
                forward, inputs, targets = next(iterator)
                stepped = self._batch(forward, inputs, targets)
            except StopIteration:
                complete = True
                if self.window.pending:
                    self._close_window()
                    self._at_max_steps()
                break
            except KeyboardInterrupt:  # raised where no handler could defer it
                self.interrupt_requested = True
                continue
            samples += len(targets)
            self.samples += len(targets)
            batch_index += 1
            if not stepped:  # the window is open: no step to count or check yet
                continue
            epoch_steps += 1
            if self._at_max_steps():
                complete = batch_index == self.batches_per_epoch
                break
            now = perf_counter()
            if now - last_check < self.check_seconds:
                continue
            last_check = now
            if not self._check():
                break
            if now - last_redraw >= plan.observer.refresh_seconds:
                last_redraw = now
                plan.observer.on_step(
                    StepInfo(
                        epoch=epoch + 1,
                        epochs=plan.epochs,
                        step=self.steps,
                        batch=epoch_steps,
                        batches=self.steps_per_epoch,
                        samples_per_s=samples / (now - start),
                        loss=self.ledger.epoch_loss,
                        lrs=tuple(float(lr) for lr in self._group_lrs()),
                        data_wait=(self.source.wait_s - waited_before) / (now - start),
                        groups=self._group_names(),
                    )
                )
        if self.stop is not StopReason.NON_FINITE_LOSS:
            self._check()
        return _EpochRun(samples, perf_counter() - start, complete)

    def _epoch(self, epoch: int) -> EpochMetrics | None:
        """Train one epoch, validate, step the per-epoch schedulers; None when no step ran."""
        run = self._train_epoch(epoch)
        self.train_seconds += run.seconds
        if not run.samples:
            return None
        train_loss = self.ledger.epoch_loss
        trained_lrs = tuple(float(lr) for lr in self.trained_lrs)
        val_loss = val_acc = None
        if self.stop is not StopReason.NON_FINITE_LOSS:
            announce = getattr(self.plan.observer, "on_validation_start", None)
            if self.plan.val is not None and announce is not None:  # optional for observers
                batches = len(self.plan.val) if isinstance(self.plan.val, Sized) else None
                announce(epoch + 1, batches)
            val_loss, val_acc = self.source.validate()
            if run.complete:
                self.schedule.after_epoch(val_loss if val_loss is not None else train_loss)
        return EpochMetrics(
            epoch + 1,
            train_loss,
            val_loss,
            val_acc,
            run.samples,
            run.seconds,
            trained_lrs,
            self._group_names(),
        )

    def _pace(self, metrics: EpochMetrics) -> None:
        """After a complete epoch: note a new best (and copy its weights with keep_best),
        then unfreeze the next block, or stop early."""
        pacer, plan = self.pacer, self.plan
        if pacer is None:
            return
        value = pacer.metric(metrics.val_loss, metrics.val_accuracy)
        if value is None and pacer.pacing.needs_validation:
            what = "an accuracy" if pacer.pacing.monitor == "acc" else "a loss"
            self._stopping(
                StopReason.NO_METRIC,
                f"monitor={pacer.pacing.monitor!r} but the validation data gives no {what} "
                f"(accuracy needs class scores of shape (N, C) and integer targets); stopped "
                f"after epoch {metrics.epoch}",
            )
            return
        if pacer.observe(metrics.epoch, value) and self.best is not None:
            self.best.take(metrics.epoch)
        if metrics.epoch >= plan.epochs:
            return
        if pacer.unfreeze_due(metrics.epoch):
            event = pacer.unfreeze_next(metrics.epoch)
            # the unfreeze may have swapped BatchNorm modules (the ``frozen`` policy)
            self.batchnorm = _BatchNormSnapshot(plan.model)
            plan.observer.on_unfreeze(event)
        elif (reason := pacer.stop_reason(metrics.epoch)) is not None:
            self._stopping(StopReason.EARLY_STOP, reason)

    def _keep_best(self, epochs: Sequence[EpochMetrics]) -> int | None:
        """keep_best: load the best epoch's weights back when the run ended on another."""
        if self.best is None or self.best.epoch is None:
            return None
        if epochs and epochs[-1].epoch != self.best.epoch:
            self.best.restore()
        return self.best.epoch

    def run(self) -> FitHistory:
        plan = self.plan
        precision = plan.amp.status().dtype or "fp32"
        epochs: list[EpochMetrics] = []
        best_epoch = None
        start = perf_counter()
        plan.observer.on_start(
            FitStart(
                plan.label,
                plan.model_name,
                plan.epochs,
                plan.max_steps,
                precision,
                self.source.cached,
                self.schedule.choices,
                plan.accumulate,
                plan.clip,
            )
        )
        try:
            with _mode(plan.model, training=True), _ctrl_c_requests_stop(self._request_interrupt):
                for epoch in range(plan.epochs):
                    metrics = self._epoch(epoch)
                    if metrics is None:
                        break
                    epochs.append(metrics)
                    plan.observer.on_epoch(metrics)
                    if self.stop is not None:
                        break
                    self._pace(metrics)
                    if self.stop is not None:
                        break
                best_epoch = self._keep_best(epochs)
        except TorchMagicError:
            if not self.steps:
                discard_progress(plan.observer)
            raise
        finally:
            _clear_grads(plan.model, plan.optimizer)
            stopped = getattr(plan.observer, "on_stop", None)  # optional for observers
            if self.stop_message is not None and stopped is not None:
                stopped(self.stop_message)
            plan.observer.close()
        return FitHistory(
            label=plan.label,
            model_name=plan.model_name,
            epochs=tuple(epochs),
            steps=self.steps,
            samples=self.samples,
            seconds=perf_counter() - start,
            stopped=self.stop_message,
            cached_features=self.source.cached,
            precision=precision,
            stop_reason=self.stop,
            schedules=self.schedule.choices,
            unfreezes=tuple(self.pacer.unfrozen) if self.pacer is not None else (),
            best_epoch=best_epoch,
            data_wait_s=self.source.wait_s,
            wall_s=self.train_seconds,
            accumulate=plan.accumulate,
            clip=plan.clip,
        )


def fit(plan: FitPlan) -> FitHistory:
    """Train ``plan.model`` and return its history (also when stopped early). A plan
    that cannot train is refused before anything changes."""
    check_plan(plan)
    return _Trainer(plan).run()
