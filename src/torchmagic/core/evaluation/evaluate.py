"""One pass of a classifier over a loader, and what it measured (:class:`Evaluation`).

The pass runs in eval mode under ``inference_mode``, on the model's device with the
session's AMP policy, and leaves the model exactly as it was: weights, BatchNorm buffers,
each module's own train/eval flag, ``requires_grad`` flags, and every random generator
(torch's, CUDA's, Python's, NumPy's and the loader's own). Predictions and targets are
kept as class indices (two integers a sample); the metrics come from torchmetrics once the
pass is over, the largest losses from a bounded heap (:mod:`.samples`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import TorchMagicError, first_line
from ..training.amp import AmpController
from .compare import Comparison, compare, fingerprint
from .losses import per_sample
from .metrics import top_k_accuracy
from .running import batches, frozen_state
from .samples import WorstHeap, WorstSample

MOST_CONFUSED = 10  # pairs kept, the most frequent first


@dataclass(frozen=True)
class EvaluateOptions:
    """How to evaluate: ``worst`` samples with the largest loss to keep (0: none),
    ``top`` for top-k accuracy, the ``loss`` by name or callable, and ``against`` an
    earlier :class:`Evaluation` of the same loader (or the variable holding one)."""

    worst: int = 0
    top: int | None = None
    loss: str | Callable = "cross_entropy"
    against: Evaluation | str | None = None


@dataclass(frozen=True)
class ClassRow:
    """One class's line of the report."""

    label: str
    precision: float
    recall: float
    f1: float
    support: int


@dataclass(frozen=True, eq=False)  # holds tensors: equal only to itself
class Evaluation:
    """What one evaluation measured. ``confusion``: int64 ``[C, C]``, rows the true class,
    columns the predicted; ``most_confused``: (true label, predicted label, count), the
    most frequent first; ``correct``: one bool per sample in the loader's order, for a
    later comparison; ``normalization``: the (mean, std) the inputs were normalized with,
    when known, to draw them."""

    model_name: str
    data_name: str
    samples: int
    accuracy: float
    loss: float
    confusion: torch.Tensor
    per_class: tuple[ClassRow, ...]
    labels: tuple[str, ...]
    most_confused: tuple[tuple[str, str, int], ...]
    worst: tuple[WorstSample, ...]
    top_k: int | None
    top_k_accuracy: float | None
    correct: torch.Tensor
    targets_fingerprint: str
    comparison: Comparison | None = None
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    decode: Callable[[Any], str] | None = None  # a text input's tokens as words


@dataclass(frozen=True, eq=False)
class EvaluationPlan:
    """Everything one pass needs, resolved and checked by the session."""

    model: torch.nn.Module
    model_name: str
    data: Iterable
    data_name: str
    loss_fn: Callable
    device: torch.device
    amp: AmpController
    options: EvaluateOptions
    labels: Callable[[int], tuple[str, ...]]  # the class names for a count of classes
    against: Evaluation | None = None
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    decode: Callable[[Any], str] | None = None


def check_options(options: EvaluateOptions) -> None:
    """Refuse counts that cannot be, before the pass."""
    if isinstance(options.worst, bool) or not isinstance(options.worst, int) or options.worst < 0:
        raise TorchMagicError(
            f"worst must be a whole number of samples (0: none), got {options.worst!r}",
            param="worst",
        )
    top = options.top
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise TorchMagicError(f"top must be a positive whole number, got {top!r}", param="top")


def check_range(targets: torch.Tensor, classes: int) -> None:
    """Targets that are classes of the model's output, in one line."""
    low, high = int(targets.min()), int(targets.max())
    if low < 0 or high >= classes:
        raise TorchMagicError(
            f"targets run from {low} to {high} but the model has {classes} classes "
            f"(0 to {classes - 1})",
            param="data",
        )


def _check_batch(output: Any, targets: Any, top: int | None) -> None:
    """Classification outputs ``[B, C]`` and class-index targets ``[B]``, in one line."""
    if not isinstance(output, torch.Tensor) or output.ndim != 2:
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise TorchMagicError(
            f"evaluate measures classifiers: outputs of shape [batch, classes], got {shape}",
            param="data",
        )
    if not isinstance(targets, torch.Tensor) or targets.ndim != 1 or targets.is_floating_point():
        what = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise TorchMagicError(
            f"evaluate needs class indices as targets (integers, one per sample), got {what}",
            param="data",
        )
    if len(targets) != len(output):
        raise TorchMagicError(
            f"{len(output)} outputs for {len(targets)} targets in a batch", param="data"
        )
    check_range(targets, output.shape[1])
    if top is not None and top > output.shape[1]:
        raise TorchMagicError(f"top={top} but the model has {output.shape[1]} classes", param="top")


def _losses(
    loss_fn: Callable,
    each: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    scores: torch.Tensor,
    targets: torch.Tensor,
    per_sample: bool,
) -> torch.Tensor:
    """The batch's losses, one per sample (``each``, or when ``per_sample`` one call per
    sample), else their sum; a loss that fails is one line."""
    try:
        if each is not None:
            return each(scores, targets)
        if per_sample:
            pairs = zip(scores.split(1), targets.split(1), strict=True)
            return torch.stack([loss_fn(one, target) for one, target in pairs])
        return loss_fn(scores, targets).double() * len(targets)
    except (TypeError, ValueError, RuntimeError, IndexError) as error:
        raise TorchMagicError(
            f"the loss fails on the model's outputs: {first_line(error)}", param="loss"
        ) from error


def evaluate(plan: EvaluationPlan) -> Evaluation:
    """One pass over ``plan.data``; the model and every random state as before."""
    options = plan.options
    heap = WorstHeap(options.worst) if options.worst else None
    losses = per_sample(plan.loss_fn)
    predicted: list[torch.Tensor] = []
    targets_seen: list[torch.Tensor] = []
    total = torch.zeros((), dtype=torch.float64, device=plan.device)
    top_k: Any = None
    seen = 0
    with frozen_state(plan.model, plan.data):
        for output, targets, inputs in batches(plan.model, plan.data, plan.device, plan.amp):
            if not seen:
                _check_batch(output, targets, options.top)
                classes = output.shape[1]
                if options.top is not None:
                    top_k = top_k_accuracy(classes, options.top).to(plan.device)
            scores = output.float()
            pred = scores.argmax(dim=1)
            each = _losses(plan.loss_fn, losses, scores, targets, heap is not None)
            total += each.sum()
            if heap is not None:
                heap.offer(seen, each, targets, pred, inputs)
            if top_k is not None:
                top_k.update(scores, targets)
            predicted.append(pred)
            targets_seen.append(targets)
            seen += len(targets)
        if not seen:
            raise TorchMagicError(f"'{plan.data_name}' yields no batch", param="data")
        top_accuracy = None if top_k is None else float(top_k.compute())
    preds = torch.cat(predicted).cpu()
    truth = torch.cat(targets_seen).cpu()
    return _measured(
        plan, preds, truth, classes, loss=float(total) / seen, heap=heap, top_accuracy=top_accuracy
    )


def _measured(
    plan: EvaluationPlan,
    preds: torch.Tensor,
    truth: torch.Tensor,
    classes: int,
    *,
    loss: float,
    heap: WorstHeap | None,
    top_accuracy: float | None,
) -> Evaluation:
    from torchmetrics.functional.classification import (
        multiclass_accuracy,
        multiclass_confusion_matrix,
        multiclass_f1_score,
        multiclass_precision,
        multiclass_recall,
    )

    check_range(truth, classes)
    kwargs: dict[str, Any] = {"num_classes": classes, "average": "none"}
    confusion = multiclass_confusion_matrix(preds, truth, classes).to(torch.int64)
    precision = multiclass_precision(preds, truth, **kwargs).tolist()
    recall = multiclass_recall(preds, truth, **kwargs).tolist()
    f1 = multiclass_f1_score(preds, truth, **kwargs).tolist()
    support = confusion.sum(dim=1).tolist()
    labels = plan.labels(classes)
    rows = tuple(
        ClassRow(labels[c], precision[c], recall[c], f1[c], int(support[c])) for c in range(classes)
    )
    off = confusion.clone().fill_diagonal_(0)
    counts, places = off.flatten().sort(descending=True, stable=True)
    pairs = tuple(
        (labels[int(p) // classes], labels[int(p) % classes], int(n))
        for n, p in zip(counts[:MOST_CONFUSED], places[:MOST_CONFUSED], strict=True)
        if n > 0
    )
    correct = preds == truth
    prints = fingerprint(truth)
    against = plan.against
    comparison = (
        None
        if against is None
        else compare(correct, prints, against.correct, against.targets_fingerprint)
    )
    return Evaluation(
        model_name=plan.model_name,
        data_name=plan.data_name,
        samples=len(truth),
        accuracy=float(multiclass_accuracy(preds, truth, classes, average="micro")),
        loss=loss,
        confusion=confusion,
        per_class=rows,
        labels=labels,
        most_confused=pairs,
        worst=() if heap is None else heap.samples(plan.data),
        top_k=plan.options.top,
        top_k_accuracy=top_accuracy,
        correct=correct,
        targets_fingerprint=prints,
        comparison=comparison,
        normalization=plan.normalization,
        decode=plan.decode,
    )
