"""The samples an evaluation shows: the N largest losses, kept in a bounded heap while the
loader runs (never every prediction of a large set), with the file each came from when the
dataset knows it (``ImageFolder.samples``, also through ``Subset`` / ``random_split``)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, SequentialSampler, Subset

from ..training.data import KeywordInputs, transform_parts


@dataclass(frozen=True, eq=False)  # holds its input tensor: equal only to itself
class WorstSample:
    """One sample among the largest losses. ``index``: its position in the loader's order;
    ``path``: its file, when the dataset knows it; ``input``: the model's input for it as
    the loader gave it (on the CPU), for drawing."""

    index: int
    loss: float
    target: int
    predicted: int
    path: str | None = None
    input: Any = None


class WorstHeap:
    """The ``size`` samples with the largest loss seen so far (ties: the earlier first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._heap: list[tuple[float, int, int, int, Any]] = []  # (loss, -index, …): min first

    def offer(
        self,
        start: int,
        losses: torch.Tensor,
        targets: torch.Tensor,
        predicted: torch.Tensor,
        inputs: Any,
    ) -> None:
        """One batch, whose first sample is at position ``start`` in the loader's order:
        only its ``size`` largest losses leave the device."""
        k = min(self.size, len(losses))
        top = torch.topk(losses.float(), k).indices
        rows = zip(
            top.tolist(),
            losses[top].float().tolist(),
            targets[top].tolist(),
            predicted[top].tolist(),
            strict=True,
        )
        for i, loss, target, pred in rows:
            key = (loss, -(start + i))
            if len(self._heap) < self.size:
                heapq.heappush(self._heap, (*key, target, pred, _one(inputs, i)))
            elif key > self._heap[0][:2]:
                heapq.heapreplace(self._heap, (*key, target, pred, _one(inputs, i)))

    def samples(self, data: Iterable) -> tuple[WorstSample, ...]:
        """Largest loss first, each with its file where the dataset knows it."""
        ordered = sorted(self._heap, key=lambda e: (-e[0], -e[1]))
        return tuple(
            WorstSample(-neg, loss, target, pred, sample_path(data, -neg), one)
            for loss, neg, target, pred, one in ordered
        )


def _one(inputs: Any, i: int) -> Any:
    """Sample ``i`` of a batch's inputs, copied to the CPU (a tensor, or a text batch's
    keyword tensors)."""
    if isinstance(inputs, torch.Tensor):
        return inputs[i].detach().to("cpu", copy=True)
    if isinstance(inputs, KeywordInputs):
        return {k: v[i].detach().cpu() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    return None


def sample_path(data: Iterable, index: int) -> str | None:
    """The file of the sample at ``index`` in the loader's order: known when the loader
    visits its dataset in order and the dataset under its ``Subset`` wrappers lists its
    files (``samples`` of (path, class) pairs, or ``imgs``)."""
    if not isinstance(data, DataLoader) or not isinstance(data.sampler, SequentialSampler):
        return None
    dataset: Any = data.dataset
    while isinstance(dataset, Subset):
        index = int(dataset.indices[index])
        dataset = dataset.dataset
    listed = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
    if isinstance(listed, list) and 0 <= index < len(listed):
        entry = listed[index]
        path = entry[0] if isinstance(entry, tuple) else entry
        return str(path) if isinstance(path, str) else None
    return None


def normalization(transform: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The (mean, std) of the first torchvision ``Normalize`` in ``transform`` (or of
    the weights' preset, which keeps them as attributes), to draw inputs un-normalized."""
    for part in transform_parts(transform):
        mean, std = getattr(part, "mean", None), getattr(part, "std", None)
        if mean is not None and std is not None:
            return tuple(float(m) for m in mean), tuple(float(s) for s in std)
    return None
