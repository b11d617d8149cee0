"""Models by name with the weights, transforms and labels that belong to them.

Replacing the last layer is not enough: pretrained weights expect their own input size
and normalisation, and their outputs mean their own categories. This module builds a
torchvision model with the ``weights=`` API (never ``pretrained=True``), a timm model, or
a Hugging Face image classifier, and returns with it what the weights expect, so the
data pipeline and the doctor can check against it.

The metadata of torchvision and timm weights ships with the library: reading it never
downloads. Building a model *with* weights downloads them once (into ``TORCH_HOME`` /
the Hugging Face cache); offline that fails with one line naming ``weights=None``.
Hugging Face's image processors are downloads too, so offline only config-built models
(``hf:vit``, a ``model_type``) work, without a preprocess.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import TorchMagicError

SOURCES = ("torchvision", "timm", "hf")
NO_WEIGHTS = ("none", "None", "")


@dataclass(frozen=True)
class WeightsInfo:
    """What a set of pretrained weights expects and reports (None: not known)."""

    name: str  # "ResNet18_Weights.IMAGENET1K_V1", "resnet18.a1_in1k", a hub id
    source: str  # "torchvision", "timm" or "hf"
    num_params: int | None = None
    metrics: tuple[tuple[str, str, float], ...] = ()  # (dataset, metric, value)
    crop_size: int | None = None  # side of the square input the weights were trained on
    resize_size: int | None = None  # resize before the crop (torchvision presets)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    num_categories: int | None = None
    file_mb: float | None = None  # download size, when the library says


@dataclass(frozen=True)
class LoadedModel:
    """A built model and what its weights bring. ``weights`` is the torchvision
    ``WeightsEnum`` member (timm: the pretrained tag; hf: the hub id); None without."""

    model: nn.Module
    name: str
    source: str
    weights: Any
    preprocess: Callable | None
    categories: tuple[str, ...] | None
    info: WeightsInfo | None  # None when there are no weights and nothing is known


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _unknown(name: str, known: list[str], where: str) -> TorchMagicError:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return TorchMagicError(f"no model named '{name}' in {where}{hint}", param="name")


def split_source(name: str) -> tuple[str, str]:
    """``"timm:resnet18"`` → ("timm", "resnet18"); a bare name is torchvision's, else
    timm's when timm is installed and knows it."""
    source, sep, rest = name.partition(":")
    if sep and source in SOURCES:
        if not rest:
            raise TorchMagicError(f"'{name}' names no model after '{source}:'", param="name")
        return source, rest
    from torchvision import models

    if name in models.list_models():
        return "torchvision", name
    if _installed("timm"):
        import timm

        if timm.is_model(name):
            return "timm", name
    raise _unknown(name, models.list_models(), "torchvision (prefix timm: or hf: for those)")


def _no_weights(spec: object) -> bool:
    return spec is None or spec is False or (isinstance(spec, str) and spec in NO_WEIGHTS)


# -- torchvision ---------------------------------------------------------------------


def torchvision_weights(name: str, spec: str | None = "DEFAULT") -> Any:
    """The ``WeightsEnum`` member ``spec`` names for model ``name`` (``DEFAULT``, a member
    name such as ``IMAGENET1K_V2``, or ``Enum.MEMBER``); None for no weights."""
    from torchvision import models

    if name not in models.list_models():
        raise _unknown(name, models.list_models(), "torchvision")
    if _no_weights(spec):
        return None
    enum = models.get_model_weights(name)
    member = str(spec).rpartition(".")[2]
    choices = ["DEFAULT", *enum.__members__]
    if member.upper() == "DEFAULT":
        return enum.DEFAULT
    if member not in enum.__members__:
        raise TorchMagicError(
            f"{enum.__name__} has no '{spec}': choose one of {', '.join(choices)} or None",
            param="weights",
        )
    return enum[member]


def _first(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return int(value) if value is not None else None


def _floats(value: Any) -> tuple[float, ...] | None:
    return None if value is None else tuple(float(v) for v in value)


def describe(weights: Any) -> WeightsInfo:
    """Metadata of a torchvision ``WeightsEnum`` member, read from the enum: no download.
    The input size and normalisation come from ``weights.transforms()``."""
    meta = weights.meta
    transforms = weights.transforms()
    metrics = tuple(
        (dataset, metric, float(value))
        for dataset, values in meta.get("_metrics", {}).items()
        for metric, value in values.items()
        if isinstance(value, (int, float))
    )
    categories = meta.get("categories")
    return WeightsInfo(
        name=f"{type(weights).__name__}.{weights.name}",
        source="torchvision",
        num_params=meta.get("num_params"),
        metrics=metrics,
        crop_size=_first(getattr(transforms, "crop_size", None)),
        resize_size=_first(getattr(transforms, "resize_size", None)),
        mean=_floats(getattr(transforms, "mean", None)),
        std=_floats(getattr(transforms, "std", None)),
        num_categories=len(categories) if categories is not None else None,
        file_mb=meta.get("_file_size"),
    )


def is_weights(value: object) -> bool:
    """A torchvision ``WeightsEnum`` member (checked without importing torchvision)."""
    cls = type(value)
    return any(
        base.__name__ == "WeightsEnum" and base.__module__.startswith("torchvision")
        for base in cls.__mro__
    )


def _fetch_failed(what: str, name: str, error: BaseException, where: str) -> TorchMagicError:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return TorchMagicError(
        f"cannot fetch the weights {what} ({reason}); offline? build '{name}' without "
        f"them with weights=None, or put the file in {where} first",
        param="weights",
    )


def _torchvision(name: str, spec: str | None, progress: bool) -> LoadedModel:
    from torchvision import models

    weights = torchvision_weights(name, spec)
    if weights is None:
        return LoadedModel(
            models.get_model(name, weights=None), name, "torchvision", None, None, None, None
        )
    try:
        model = models.get_model(name, weights=weights, progress=progress)
    except OSError as error:  # URLError, HTTPError, socket and disk errors
        raise _fetch_failed(
            f"{type(weights).__name__}.{weights.name}",
            name,
            error,
            f"{torch.hub.get_dir()}/checkpoints",
        ) from None
    categories = weights.meta.get("categories")
    return LoadedModel(
        model,
        name,
        "torchvision",
        weights,
        weights.transforms(),
        tuple(categories) if categories else None,
        describe(weights),
    )


# -- timm ----------------------------------------------------------------------------


def _timm_name(name: str, spec: str | None) -> str:
    """``resnet18`` + ``a1_in1k`` → ``resnet18.a1_in1k``; DEFAULT keeps timm's default tag."""
    if _no_weights(spec) or str(spec).upper() == "DEFAULT":
        return name
    return f"{name.partition('.')[0]}.{spec}"


def timm_info(name: str, spec: str | None = "DEFAULT") -> WeightsInfo:
    """Metadata of timm weights from its pretrained config: no download."""
    import timm

    full = _timm_name(name, spec)
    cfg = timm.models.get_pretrained_cfg(full)
    if cfg is None:
        raise _unknown(full, timm.list_pretrained(name.partition(".")[0] + "*"), "timm")
    side = _first(cfg.input_size[-1:])
    return WeightsInfo(
        name=f"{full.partition('.')[0]}.{cfg.tag}" if cfg.tag else full,
        source="timm",
        crop_size=side,
        resize_size=round(side / cfg.crop_pct) if side and cfg.crop_pct else None,
        mean=_floats(cfg.mean),
        std=_floats(cfg.std),
        num_categories=cfg.num_classes or None,
    )


def _timm(name: str, spec: str | None) -> LoadedModel:
    import timm
    import timm.data

    pretrained = not _no_weights(spec)
    full = _timm_name(name, spec)
    if not timm.is_model(full):
        raise _unknown(full, timm.list_models(), "timm")
    try:
        model = timm.create_model(full, pretrained=pretrained)
    except OSError as error:  # the hub's offline / not-found errors are OSErrors
        raise _fetch_failed(full, f"timm:{name}", error, "the Hugging Face cache") from None
    config = timm.data.resolve_data_config({}, model=model)
    info = timm_info(name, spec) if pretrained else None
    categories = None
    if pretrained and (subset := timm.data.infer_imagenet_subset(model)):
        categories = tuple(timm.data.ImageNetInfo(subset).label_descriptions())
    return LoadedModel(
        model,
        full,
        "timm",
        model.pretrained_cfg.get("tag") if pretrained else None,  # type: ignore[operator,union-attr]
        timm.data.create_transform(**config) if pretrained else None,
        categories,
        info,
    )


# -- Hugging Face --------------------------------------------------------------------


def _hf(name: str, spec: str | None) -> LoadedModel:
    from transformers import (
        AutoConfig,
        AutoImageProcessor,
        AutoModelForImageClassification,
    )

    try:
        if not _no_weights(spec):
            model = AutoModelForImageClassification.from_pretrained(name)
            processor = AutoImageProcessor.from_pretrained(name)
        elif "/" in name:
            config = AutoConfig.from_pretrained(name)
            model, processor = AutoModelForImageClassification.from_config(config), None
        else:  # a model type: a default config, built offline
            config = AutoConfig.for_model(name)
            model, processor = AutoModelForImageClassification.from_config(config), None
    except OSError as error:
        raise _fetch_failed(
            name,
            f"hf:{name}",
            error,
            "the Hugging Face cache (offline, only a model type such as hf:vit builds)",
        ) from None
    except ValueError as error:  # an unknown model type
        raise TorchMagicError(str(error).splitlines()[0], param="name") from None
    config = model.config
    labels = getattr(config, "id2label", None) or {}
    size = getattr(config, "image_size", None)
    info = WeightsInfo(
        name=name,
        source="hf",
        num_params=sum(p.numel() for p in model.parameters()),
        crop_size=_first(size) if isinstance(size, (int, list, tuple)) else None,
        mean=_floats(getattr(processor, "image_mean", None)),
        std=_floats(getattr(processor, "image_std", None)),
        num_categories=len(labels) or None,
    )
    categories = tuple(labels[i] for i in sorted(labels)) if processor is not None else None
    return LoadedModel(
        model, name, "hf", name if processor is not None else None, processor, categories, info
    )


# -- the front door ------------------------------------------------------------------


def weights_info(name: str, weights: str | None = "DEFAULT") -> WeightsInfo | None:
    """What ``weights`` of model ``name`` expect, without building or downloading
    anything (torchvision and timm); None for ``weights=None``."""
    source, bare = split_source(name)
    if _no_weights(weights):
        return None
    if source == "torchvision":
        return describe(torchvision_weights(bare, weights))
    if source == "timm":
        return timm_info(bare, weights)
    raise TorchMagicError(
        "Hugging Face keeps its metadata on the hub: load the model to read it", param="name"
    )


def load_model(
    name: str, weights: str | None = "DEFAULT", *, progress: bool = False
) -> LoadedModel:
    """Build model ``name`` (``resnet18``, ``timm:convnext_tiny``, ``hf:vit``) with
    ``weights``: ``"DEFAULT"``, a named set (``"IMAGENET1K_V2"``; timm: a tag such as
    ``"a1_in1k"``) or None. Returns the model with its preprocess, categories and the
    weights' metadata; replacing the head is the caller's next step."""
    source, bare = split_source(name)
    if source == "torchvision":
        return _torchvision(bare, weights, progress)
    if source == "timm":
        if not _installed("timm"):
            raise TorchMagicError("timm is not installed (pip install timm)", param="name")
        return _timm(bare, weights)
    if not _installed("transformers"):
        raise TorchMagicError(
            "transformers is not installed (pip install transformers)", param="name"
        )
    return _hf(bare, weights)


def expected_inputs(weights: Any) -> WeightsInfo | None:
    """A ``WeightsInfo`` for what ``weights`` is: a ``WeightsInfo`` already, a torchvision
    ``WeightsEnum`` member, or a :class:`LoadedModel`; None otherwise."""
    if isinstance(weights, WeightsInfo):
        return weights
    if isinstance(weights, LoadedModel):
        return weights.info
    if is_weights(weights):
        return describe(weights)
    return None
