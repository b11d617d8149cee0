"""Where a run's batches come from, and its validation: the loader through the whole
model, or (``cache_features``) the head on stored backbone features.

The history's ``data_wait_s`` adds up, per step, the time from asking for the next
batch to having its inputs and targets on the device (the copy is only enqueued when it
is non-blocking: no extra sync); on the cached-feature path only the loading counts.
``wall_s`` is the time of the training passes it is measured within (validation
excluded), so ``data_wait_s / wall_s`` is the share of training time spent waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..errors import TorchMagicError
from . import feature_cache
from .batch_loss import main_output
from .data import call_model, load_batch, next_epoch_indices, split_batch, to_device
from .run_guards import module_mode

if TYPE_CHECKING:
    from .fit_plan import FitPlan

# The data-wait clock. The loop's own clock (``perf_counter``) is read once per step and
# sets the check-point cadence; waiting is timed apart from it.
_wait_clock = time.perf_counter


def _accuracy_hits(output: Any, targets: torch.Tensor) -> torch.Tensor | None:
    if (
        isinstance(output, torch.Tensor)
        and output.ndim == 2
        and targets.ndim == 1
        and not targets.is_floating_point()
    ):
        return (output.argmax(dim=1) == targets).sum()
    return None


Scores = tuple[float | None, float | None, dict[str, float]]  # loss, accuracy, metrics
MetricFactories = tuple[tuple[str, Callable[[int], Any]], ...]


def _metrics_for(output: Any, targets: torch.Tensor, factories: MetricFactories) -> dict:
    """The torchmetrics metrics of a run, built on its first validation batch (their
    class count is the output's): none when the outputs are not class scores ``(N, C)``
    with integer targets, and none that torchmetrics refuses for that count."""
    if not factories or _accuracy_hits(output, targets) is None:
        return {}
    built = {}
    for name, factory in factories:
        try:
            built[name] = factory(output.shape[1]).to(output.device)
        except ValueError:  # e.g. top-5 accuracy over fewer than 5 classes
            continue
    return built


def _score(
    pairs: Iterable[tuple[Any, torch.Tensor]], loss_fn: Callable, factories: MetricFactories = ()
) -> Scores:
    """(mean loss, accuracy or None, the named metrics) over (output, targets) pairs,
    summed on the device and read once at the end."""
    total: torch.Tensor | float = 0.0
    hits: torch.Tensor | int = 0
    seen, counted = 0, True
    metrics: dict[str, Any] | None = None
    for output, targets in pairs:
        total = total + loss_fn(output, targets).detach().float() * len(targets)
        batch_hits = _accuracy_hits(output, targets) if counted else None
        if batch_hits is None:
            counted = False
        else:
            hits = hits + batch_hits
        if metrics is None:
            metrics = _metrics_for(output, targets, factories)
        if counted:
            for metric in metrics.values():
                metric.update(output.detach().float(), targets)
        seen += len(targets)
    if not seen:
        return None, None, {}
    values = {name: float(m.compute()) for name, m in (metrics or {}).items()} if counted else {}
    return float(total) / seen, (float(hits) / seen if counted else None), values


def _non_blocking(loader: Iterable, device: torch.device) -> bool:
    return bool(getattr(loader, "pin_memory", False)) and device.type == "cuda"


Batch = tuple[Callable[[Any], Any], Any, torch.Tensor]  # (forward, inputs, targets)


class LoaderBatches:
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

    def validate(self) -> Scores:
        plan = self.plan
        if plan.val is None:
            return None, None, {}
        non_blocking = _non_blocking(plan.val, plan.device)

        def pairs() -> Iterator[tuple[Any, torch.Tensor]]:
            for batch in plan.val:  # type: ignore[union-attr]
                inputs, targets = split_batch(batch, "val")
                inputs = to_device(inputs, plan.device, non_blocking)
                with plan.amp.autocast():
                    output = main_output(call_model(plan.model, inputs))
                yield output, to_device(targets, plan.device, non_blocking)

        with module_mode(plan.model, training=False), torch.no_grad():
            return _score(pairs(), plan.loss_fn, plan.metrics)


class CachedFeatureBatches:
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
        with module_mode(plan.model, training=False), torch.no_grad(), plan.amp.autocast():
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
            with (
                module_mode(self.head.module, training=False),
                torch.no_grad(),
                plan.amp.autocast(),
            ):
                again = main_output(self.head.module(feats))
            if not torch.allclose(again.float(), main_output(output).float(), atol=1e-5):
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

    def validate(self) -> Scores:
        plan = self.plan
        if plan.val is None:
            return None, None, {}
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
        with module_mode(head, training=False), torch.no_grad(), plan.amp.autocast():
            pairs = ((main_output(head(f)), t) for f, t in self.val_features)
            return _score(pairs, plan.loss_fn, plan.metrics)


def batch_source(plan: FitPlan) -> LoaderBatches | CachedFeatureBatches:
    """Where the run's batches come from: the loader through the whole model, or
    (``cache_features``) the head on stored backbone features."""
    return CachedFeatureBatches(plan) if plan.cache_features else LoaderBatches(plan)
