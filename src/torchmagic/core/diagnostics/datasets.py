"""What the doctor reads from the user's data without disturbing it: the labels a
dataset declares, its class names, the ``Normalize`` in its transforms, and one batch.

Nothing here iterates a user's iterator: a one-shot iterator or generator would lose
its batches. A batch is fetched from a map-style DataLoader's dataset in this process
(no worker starts), with every random generator restored afterwards, so the user's
next epoch draws exactly what it would have.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

from ..rng import preserved_rng
from ..training.data import base_dataset, load_batch, split_batch, transform_parts

TARGET_ATTRIBUTES = ("targets", "labels", "y")
# errors a user's dataset may raise when fetched out of its usual context
_FETCH_ERRORS = (IndexError, KeyError, TypeError, ValueError, RuntimeError, OSError)


@dataclass(frozen=True)
class Normalization:
    mean: tuple[float, ...]
    std: tuple[float, ...]


def _as_labels(value: object) -> torch.Tensor | None:
    """Class indices as a 1-D integer tensor; None for anything else (one-hot, floats)."""
    tensor: torch.Tensor | None
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        tensor = torch.tensor(value)
    else:
        try:  # NumPy arrays, without importing NumPy
            tensor = torch.as_tensor(value) if hasattr(value, "__array__") else None
        except (TypeError, ValueError, RuntimeError):
            return None
    if tensor is None or tensor.ndim != 1 or tensor.is_floating_point() or tensor.is_complex():
        return None
    if tensor.dtype == torch.bool or not tensor.numel():
        return None
    return tensor


def declared_labels(dataset: object) -> torch.Tensor | None:
    """The labels a dataset holds as an attribute (``targets``, ``labels``, ``y``; a
    TensorDataset's last tensor), restricted to a Subset's indices."""
    if isinstance(dataset, Subset):
        labels = declared_labels(dataset.dataset)
        if labels is None:
            return None
        return labels[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        return _as_labels(dataset.tensors[-1])
    for attribute in TARGET_ATTRIBUTES:
        labels = _as_labels(getattr(dataset, attribute, None))
        if labels is not None:
            return labels
    return None


def declared_classes(dataset: object) -> int | None:
    """How many classes the dataset says it has (its ``classes`` list)."""
    classes = getattr(base_dataset(dataset), "classes", None)
    if isinstance(classes, (list, tuple, dict)) and classes:
        return len(classes)
    return None


def normalizations(dataset: object) -> Iterator[Normalization]:
    """Every mean/std normalisation in the dataset's transforms: torchvision's
    ``Normalize`` (v1, v2) and the weights' own presets (``weights.transforms()``)."""
    base = base_dataset(dataset)
    for attribute in ("transform", "transforms"):
        for part in transform_parts(getattr(base, attribute, None)):
            mean, std = getattr(part, "mean", None), getattr(part, "std", None)
            if (
                mean is None
                or std is None
                or not type(part).__module__.startswith("torchvision.transforms")
            ):
                continue
            yield Normalization(_floats(mean), _floats(std))


def _floats(value: Any) -> tuple[float, ...]:
    if isinstance(value, torch.Tensor):
        return tuple(float(v) for v in value.flatten())
    if isinstance(value, (int, float)):
        return (float(value),)
    return tuple(float(v) for v in value)


def peek(loader: object) -> Any | None:
    """A batch of a map-style DataLoader (its first batch-size samples, collated as
    its workers would), fetched in this process with the random state restored; None for
    anything that cannot be read without consuming it."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    dataset: Dataset = loader.dataset
    try:
        size = len(dataset)  # type: ignore[arg-type]  # map-style datasets usually have one
    except TypeError:
        return None
    if not size:
        return None
    per_batch = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
    indices = list(range(min(per_batch, size)))
    with preserved_rng([loader.generator]):
        try:
            return load_batch(loader, indices)
        except _FETCH_ERRORS:
            return None


def batch_parts(batch: Any) -> tuple[Any, torch.Tensor | None]:
    """(inputs, class-index labels or None) of a batch in one of the usual shapes."""
    try:
        inputs, targets = split_batch(batch)
    except TypeError:
        return None, None
    return inputs, _as_labels(targets)


def image_size(inputs: Any) -> tuple[int, int] | None:
    """(height, width) of a batch of images (N × C × H × W floats)."""
    if isinstance(inputs, torch.Tensor) and inputs.ndim == 4 and inputs.is_floating_point():
        return int(inputs.shape[-2]), int(inputs.shape[-1])
    return None
