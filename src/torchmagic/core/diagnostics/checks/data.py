"""Data, weights and head that must match.

Replacing the last layer is not enough: labels must fit the head, and the inputs must
look like what the pretrained weights saw (normalisation, resolution). One check reads the
namespace's data once and judges each model against it, model by model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ...advice import Call
from ...errors import TorchMagicError
from ...surgery.heads import Head, find_head
from ...training.data import IGNORE_INDEX
from ...workspace import Workspace
from ...zoo import WeightsInfo, describe, expected_inputs, is_weights
from .. import datasets
from ..context import DoctorContext, ModelEntry
from ..findings import Finding
from ..registry import CheckGroup

checks = CheckGroup()

# Input sides further than this factor from the weights' crop size are reported.
RESOLUTION_FACTOR = 2.0
# Normalize mean / std values closer than this count as the same.
NORM_TOLERANCE = 2e-3


@dataclass(frozen=True)
class _Data:
    """One dataset in the namespace (bound itself, or as a loader's ``.dataset``)."""

    name: str  # the variable: a loader's name when seen through a loader
    dataset: object
    batch: object | None  # a peeked batch (loaders only)


def _data_sources(ws: Workspace) -> list[_Data]:
    loaders = [(n, v) for n, v in ws.items() if isinstance(v, DataLoader)]
    seen = {id(v.dataset) for _, v in loaders}
    found = [_Data(n, v.dataset, datasets.peek(v)) for n, v in loaders]
    found += [
        _Data(n, v, None)
        for n, v in ws.items()
        if isinstance(v, Dataset) and not isinstance(v, IterableDataset) and id(v) not in seen
    ]
    return found


def _head_of(model: nn.Module) -> Head | None:
    try:
        return find_head(model)
    except TorchMagicError:
        return None


def _labels(source: _Data) -> torch.Tensor | None:
    labels = datasets.declared_labels(source.dataset)
    if labels is None and source.batch is not None:
        labels = datasets.batch_parts(source.batch)[1]
    return labels


def _label_range(name: str, head: Head, sources: list[_Data]) -> Iterator[Finding]:
    classes = head.out_features
    for source in sources:
        labels = _labels(source)
        if labels is None:
            continue
        real = labels[labels != IGNORE_INDEX]
        if not real.numel():
            continue
        low, high = int(real.min()), int(real.max())
        if high < classes and low >= 0:
            continue
        where = f"{name}.{head.name}" if head.name else name
        bad = high if high >= classes else low
        yield Finding(
            "labels",
            "error",
            f"{source.name} → {where}",
            f"{source.name} has label {bad} but {where} has {classes} outputs (labels "
            f"0 to {classes - 1}): cross_entropy fails, on the GPU as 'device-side assert "
            "triggered'",
            (
                Call("replace_head", (f"{name}.{head.name}", high + 1)),
                f" for {high + 1} classes, or map the labels to 0..{classes - 1}",
            )
            if head.name
            else f"map the labels to 0..{classes - 1}",
        )


def _class_count(name: str, head: Head, sources: list[_Data]) -> Iterator[Finding]:
    for source in sources:
        declared = datasets.declared_classes(source.dataset)
        if declared is None or declared == head.out_features:
            continue
        where = f"{name}.{head.name}" if head.name else name
        yield Finding(
            "classes",
            "warning",
            f"{source.name} → {where}",
            f"{source.name} declares {declared} classes but {where} has "
            f"{head.out_features} outputs",
            (Call("replace_head", (where, declared)),),
        )


def _weights_categories(
    name: str, head: Head, weights: WeightsInfo, replaced: bool
) -> Iterator[Finding]:
    """A head that is not the weights' own, changed outside the session: the weights'
    ``categories`` no longer name its outputs."""
    if replaced or weights.num_categories in (None, head.out_features):
        return
    where = f"{name}.{head.name}" if head.name else name
    yield Finding(
        "classes",
        "info",
        where,
        f"{where} has {head.out_features} outputs but {weights.name} has "
        f"{weights.num_categories} categories: weights.meta['categories'] does not name "
        "its predictions",
        "decode predictions with your dataset's class names, not the weights' categories",
    )


def _same(values: tuple[float, ...], expected: tuple[float, ...]) -> bool:
    if len(values) == 1:
        values = values * len(expected)
    return len(values) == len(expected) and all(
        abs(a - b) <= NORM_TOLERANCE for a, b in zip(values, expected, strict=True)
    )


def _short(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"


def _normalisation(name: str, weights: WeightsInfo, sources: list[_Data]) -> Iterator[Finding]:
    if weights.mean is None or weights.std is None:
        return
    for source in sources:
        for norm in datasets.normalizations(source.dataset):
            if _same(norm.mean, weights.mean) and _same(norm.std, weights.std):
                continue
            yield Finding(
                "normalization",
                "warning",
                f"{source.name} → {name}",
                f"{source.name} normalises with mean {_short(norm.mean)} std "
                f"{_short(norm.std)}; {name}'s weights {weights.name} expect mean "
                f"{_short(weights.mean)} std {_short(weights.std)}: every input is "
                "shifted from what the pretrained features saw",
                f"Normalize(mean={list(weights.mean)}, std={list(weights.std)}), or use the "
                "weights' own transforms (weights.transforms())",
            )


def _resolution(name: str, weights: WeightsInfo, sources: list[_Data]) -> Iterator[Finding]:
    crop = weights.crop_size
    if not crop:
        return
    for source in sources:
        inputs = datasets.batch_parts(source.batch)[0] if source.batch is not None else None
        size = datasets.image_size(inputs)
        if size is None:
            continue
        if crop / RESOLUTION_FACTOR <= min(size) and max(size) <= crop * RESOLUTION_FACTOR:
            continue
        yield Finding(
            "resolution",
            "warning",
            f"{source.name} → {name}",
            f"{source.name} gives {size[0]}×{size[1]} images; {name}'s weights "
            f"{weights.name} were trained on {crop}×{crop} crops: the pretrained "
            "features fit that scale (fixed-size models such as ViT fail outright)",
            f"resize to about {crop} in the dataset's transforms (the weights' "
            "transforms() resize and crop as trained)",
        )


def _known_weights(
    ws: Workspace, models: tuple[ModelEntry, ...], recorded: Mapping[str, object]
) -> dict[str, WeightsInfo]:
    """Model name → what its pretrained weights expect: recorded by ``load_model``, else
    a torchvision ``WeightsEnum`` member bound in the namespace, applied to the only model
    or to the models whose class the enum is named after (``ResNet`` / ``ResNet18_Weights``)."""
    known = {n: info for n, w in recorded.items() if (info := expected_inputs(w)) is not None}
    bound = [v for _, v in ws.items() if is_weights(v)]
    for value in dict.fromkeys(bound):
        info = describe(value)
        enum_name = type(value).__name__.lower()
        for model in models:
            if model.name in known:
                continue
            if len(models) == 1 or enum_name.startswith(type(model.module).__name__.lower()):
                known[model.name] = info
    return known


@checks.namespace
def data_and_weights(context: DoctorContext) -> Iterator[Finding]:
    """Labels, class counts, normalisation and resolution of the data in the namespace
    against the trained models (the only model, when none is trained yet)."""
    models = context.models
    only = {models[0].name: models[0].module} if len(models) == 1 else {}
    checked = context.trained or only
    known = _known_weights(context.ws, models, context.weights)
    sources = _data_sources(context.ws) if checked else []
    for name, model in checked.items():
        head = _head_of(model)
        if head is not None:
            yield from _label_range(name, head, sources)
            yield from _class_count(name, head, sources)
        info = known.get(name)
        if info is None:
            continue
        if head is not None:
            yield from _weights_categories(name, head, info, name in context.replaced_heads)
        yield from _normalisation(name, info, sources)
        yield from _resolution(name, info, sources)
