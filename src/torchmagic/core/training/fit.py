"""The training loop behind %fit: device moves, AMP, scheduler stepping, live progress
through an observer, clean stops on Ctrl-C and non-finite losses, and the cached-feature
path for linear probing.

Scheduler stepping: OneCycleLR and CyclicLR after every optimizer step; every other
scheduler once per epoch; ReduceLROnPlateau with the validation loss (the training loss
when there is no validation loader).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler as torch_schedulers

from ..errors import TorchMagicError
from . import feature_cache
from .amp import AmpController
from .data import load_batch, next_epoch_indices, split_batch, to_device

LOSSES: dict[str, Callable] = {
    "cross_entropy": F.cross_entropy,
    "nll": F.nll_loss,
    "bce": F.binary_cross_entropy_with_logits,
    "mse": F.mse_loss,
    "l1": F.l1_loss,
    "smooth_l1": F.smooth_l1_loss,
    "huber": F.huber_loss,
}
_PER_BATCH = (torch_schedulers.OneCycleLR, torch_schedulers.CyclicLR)


@dataclass(frozen=True)
class StepInfo:
    """A progress snapshot: sent to the observer at most every ``refresh_seconds``."""

    epoch: int
    epochs: int
    step: int
    batch: int
    batches: int | None
    samples_per_s: float
    loss: float
    lrs: tuple[float, ...]


@dataclass(frozen=True)
class EpochMetrics:
    epoch: int
    train_loss: float
    val_loss: float | None
    val_accuracy: float | None
    samples: int
    seconds: float
    lrs: tuple[float, ...]


@dataclass(frozen=True)
class FitHistory:
    """One %fit run: per-epoch metrics and how it ended."""

    label: str
    model_name: str
    epochs: tuple[EpochMetrics, ...]
    steps: int
    samples: int
    seconds: float
    stopped: str | None = None  # why it ended early, in words; None when it ran to the end
    cached_features: bool = False
    precision: str = "fp32"

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


class FitObserver(Protocol):
    refresh_seconds: float

    def on_step(self, info: StepInfo) -> None: ...

    def on_epoch(self, metrics: EpochMetrics) -> None: ...

    def close(self) -> None: ...


class _Silent:
    refresh_seconds = float("inf")

    def on_step(self, info: StepInfo) -> None:
        pass

    def on_epoch(self, metrics: EpochMetrics) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class FitPlan:
    """Everything one run needs, resolved and checked by the session."""

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
    label: str = ""
    observer: FitObserver = field(default_factory=_Silent)


def resolve_loss(name: str, namespace: dict) -> Callable:
    """A loss by name (``cross_entropy``, ``mse``…) or a callable bound to a variable."""
    if name in LOSSES:
        return LOSSES[name]
    value = namespace.get(name)
    if callable(value):
        return value
    raise TorchMagicError(
        f"unknown loss '{name}': use one of {', '.join(LOSSES)} or the name of a callable"
    )


@contextmanager
def _ctrl_c_stops_after_batch(flag: list[bool]) -> Iterator[None]:
    """Ctrl-C sets a flag instead of raising mid-step, so the loop stops between batches."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame) -> None:
        flag[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _accuracy_hits(output: Any, targets: torch.Tensor) -> int | None:
    if (
        isinstance(output, torch.Tensor)
        and output.ndim == 2
        and targets.ndim == 1
        and not targets.is_floating_point()
    ):
        return int((output.argmax(dim=1) == targets).sum())
    return None


def _score(pairs: Iterable[tuple[Any, torch.Tensor]], loss_fn: Callable):
    """(mean loss, accuracy or None) over (output, targets) pairs."""
    total, hits, seen, counted = 0.0, 0, 0, True
    for output, targets in pairs:
        total += float(loss_fn(output, targets)) * len(targets)
        h = _accuracy_hits(output, targets)
        counted = counted and h is not None
        hits += h or 0
        seen += len(targets)
    if not seen:
        return None, None
    return total / seen, (hits / seen if counted else None)


def _main_output(output: Any) -> Any:
    """torchvision's GoogLeNet/Inception return namedtuples in train mode: use ``.logits``."""
    return getattr(output, "logits", output)


class _Trainer:
    def __init__(self, plan: FitPlan) -> None:
        self.plan = plan
        self.per_batch = [s for s in plan.schedulers if isinstance(s, _PER_BATCH)]
        self.per_epoch = [s for s in plan.schedulers if not isinstance(s, _PER_BATCH)]
        self.steps = 0
        self.samples = 0
        self.interrupted = [False]
        self.stopped: str | None = None
        self.non_blocking = bool(getattr(plan.train, "pin_memory", False)) and (
            plan.device.type == "cuda"
        )

    # -- one optimizer step ----------------------------------------------------------

    def _step(
        self, forward: Callable[[Any], Any], inputs: Any, targets: torch.Tensor
    ) -> torch.Tensor:
        plan = self.plan
        with plan.amp.autocast():
            output = _main_output(forward(inputs))
            loss = plan.loss_fn(output, targets)
        value = loss.detach()
        if not bool(torch.isfinite(value)):
            self.stopped = (
                f"the loss became {float(value)} at step {self.steps + 1}; stopped before "
                "that step's update (weights are from the step before)"
            )
            plan.optimizer.zero_grad(set_to_none=True)
            return loss.detach()
        plan.amp.step(loss, plan.optimizer)
        self.steps += 1
        for scheduler in self.per_batch:
            scheduler.step()
        return loss.detach()

    # -- epochs ----------------------------------------------------------------------

    def _batches(
        self, epoch: int
    ) -> Iterator[tuple[Callable, Any, torch.Tensor, list[int] | None]]:
        """(forward, inputs, targets, indices) for each batch of one epoch."""
        plan = self.plan
        if plan.cache_features:
            for indices in next_epoch_indices(plan.train):
                if epoch == 0:
                    inputs, targets = split_batch(load_batch(plan.train, indices))
                    inputs = to_device(inputs, plan.device, False)
                    targets = to_device(targets, plan.device, False)
                    yield self.cache.head_step_from_inputs(inputs, targets, indices)
                else:
                    feats, targets = self.cache.store.get(indices)
                    yield self.cache.head.module, feats, targets, indices
            return
        for batch in plan.train:
            inputs, targets = split_batch(batch)
            yield (
                plan.model,
                to_device(inputs, plan.device, self.non_blocking),
                to_device(targets, plan.device, self.non_blocking),
                None,
            )

    def _train_epoch(self, epoch: int) -> tuple[float, int, float]:
        plan = self.plan
        batches_per_epoch = len(plan.train) if hasattr(plan.train, "__len__") else None
        total = torch.zeros((), device=plan.device)
        seen = 0
        start = last_refresh = time.perf_counter()
        iterator = self._batches(epoch)
        batch_index = 0
        plan.model.train()
        while not self.stopped:
            try:
                forward, inputs, targets, _ = next(iterator)
                loss = self._step(forward, inputs, targets)
            except StopIteration:
                break
            except KeyboardInterrupt:
                self.interrupted[0] = True
            if self.interrupted[0]:
                self.stopped = f"interrupted; the last completed step is {self.steps}"
                plan.optimizer.zero_grad(set_to_none=True)
                break
            if self.stopped:
                break
            n = len(targets)
            total += loss.float() * n
            seen += n
            self.samples += n
            batch_index += 1
            now = time.perf_counter()
            if now - last_refresh >= plan.observer.refresh_seconds:
                last_refresh = now
                plan.observer.on_step(
                    StepInfo(
                        epoch=epoch + 1,
                        epochs=plan.epochs,
                        step=self.steps,
                        batch=batch_index,
                        batches=batches_per_epoch,
                        samples_per_s=seen / (now - start),
                        loss=float(total) / seen,
                        lrs=self._lrs(),
                    )
                )
            if plan.max_steps is not None and self.steps >= plan.max_steps:
                self.stopped = f"reached --max-steps {plan.max_steps}"
                break
        return (float(total) / seen if seen else float("nan")), seen, time.perf_counter() - start

    def _lrs(self) -> tuple[float, ...]:
        return tuple(float(g["lr"]) for g in self.plan.optimizer.param_groups if g["params"])

    def _validate(self) -> tuple[float | None, float | None]:
        plan = self.plan
        if plan.val is None:
            return None, None
        if plan.cache_features:
            return self.cache.validate()

        def pairs() -> Iterator[tuple[Any, torch.Tensor]]:
            for batch in plan.val:
                inputs, targets = split_batch(batch)
                inputs = to_device(inputs, plan.device, self.non_blocking)
                with plan.amp.autocast():
                    output = _main_output(plan.model(inputs))
                yield output, to_device(targets, plan.device, self.non_blocking)

        was_training = plan.model.training
        plan.model.eval()
        try:
            with torch.no_grad():
                return _score(pairs(), plan.loss_fn)
        finally:
            plan.model.train(was_training)

    def run(self) -> FitHistory:
        plan = self.plan
        was_training = plan.model.training
        if plan.cache_features:
            self.cache = _CachedHeadTraining(
                self,
                feature_cache.check_cacheable(
                    plan.model, [plan.train] + ([plan.val] if plan.val is not None else [])
                ),
            )
        epochs: list[EpochMetrics] = []
        start = time.perf_counter()
        try:
            with _ctrl_c_stops_after_batch(self.interrupted):
                for epoch in range(plan.epochs):
                    train_loss, seen, seconds = self._train_epoch(epoch)
                    if self.stopped and not seen:
                        break
                    val_loss, val_acc = self._validate()
                    if not self.stopped or self.stopped.startswith("reached"):
                        self._step_epoch_schedulers(val_loss, train_loss)
                    metrics = EpochMetrics(
                        epoch + 1, train_loss, val_loss, val_acc, seen, seconds, self._lrs()
                    )
                    epochs.append(metrics)
                    plan.observer.on_epoch(metrics)
                    if self.stopped:
                        break
        finally:
            plan.model.train(was_training)
            plan.observer.close()
        return FitHistory(
            label=plan.label,
            model_name=plan.model_name,
            epochs=tuple(epochs),
            steps=self.steps,
            samples=self.samples,
            seconds=time.perf_counter() - start,
            stopped=self.stopped,
            cached_features=plan.cache_features,
            precision=plan.amp.status().dtype or "fp32",
        )

    def _step_epoch_schedulers(self, val_loss: float | None, train_loss: float) -> None:
        for scheduler in self.per_epoch:
            if isinstance(scheduler, torch_schedulers.ReduceLROnPlateau):
                scheduler.step(val_loss if val_loss is not None else train_loss)
            else:
                scheduler.step()


class _CachedHeadTraining:
    """The cached-feature side of a run: the first epoch fills the store while training
    the head on the features just computed; later epochs read the store."""

    def __init__(self, trainer: _Trainer, head: feature_cache.CachedHead) -> None:
        plan = trainer.plan
        self.trainer = trainer
        self.head = head
        self.store = feature_cache.FeatureStore(len(plan.train.dataset), plan.device)
        self.checked = False
        self.val_features: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _features(self, inputs: Any) -> tuple[torch.Tensor, Any]:
        """The backbone in eval mode, the model's mode restored afterwards."""
        plan = self.trainer.plan
        was_training = plan.model.training
        plan.model.eval()
        try:
            with torch.no_grad(), plan.amp.autocast():
                return feature_cache.capture_head_input(plan.model, self.head.module, inputs)
        finally:
            plan.model.train(was_training)

    def head_step_from_inputs(self, inputs: Any, targets: torch.Tensor, indices: list[int]):
        feats, output = self._features(inputs)
        if not self.checked:
            head = self.head.module
            was_training = head.training
            head.eval()
            with torch.no_grad(), self.trainer.plan.amp.autocast():
                again = _main_output(head(feats))
            head.train(was_training)
            if not torch.allclose(again.float(), _main_output(output).float(), atol=1e-5):
                raise TorchMagicError(
                    "--cache-features: the model does more after its head "
                    f"({self.head.name}); its output is not head(features)"
                )
            self.checked = True
        self.store.put(indices, feats, targets)
        return self.head.module, feats, targets, indices

    def validate(self) -> tuple[float | None, float | None]:
        plan = self.trainer.plan
        if self.val_features is not None:
            # the uncached run would iterate the loader: draw the same random numbers
            next_epoch_indices(plan.val)
        else:
            self.val_features = []
            for batch in plan.val:
                inputs, targets = split_batch(batch)
                feats, _ = self._features(to_device(inputs, plan.device, False))
                self.val_features.append((feats, to_device(targets, plan.device, False)))
        head = self.head.module
        was_training = head.training
        head.eval()
        try:
            with torch.no_grad(), plan.amp.autocast():
                pairs = ((_main_output(head(f)), t) for f, t in self.val_features)
                return _score(pairs, plan.loss_fn)
        finally:
            head.train(was_training)


def fit(plan: FitPlan) -> FitHistory:
    """Train ``plan.model`` and return its history (also when stopped early)."""
    return _Trainer(plan).run()
