"""What an inference file says about its model besides the weights: the class names, the
preprocessing the weights expect (resize, crop, mean, std) and the input it takes.

Stored as text under plain keys, each value JSON (``null`` when unknown), in each
format's own place for it (pt2: ``extra_files``, safetensors: the header's
``metadata``, onnx: ``metadata_props``), so any reader gets them back with
``json.loads`` and nothing of torchmagic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from torch import nn

from ...version import __version__

if TYPE_CHECKING:
    from ..data.transforms import Pipelines
    from ..zoo import LoadedModel

LABELS = "labels"
PREPROCESSING = "preprocessing"
INPUT = "input"
PRODUCER = "producer"
KEYS = (LABELS, PREPROCESSING, INPUT, PRODUCER)


@dataclass(frozen=True)
class Preprocessing:
    """The evaluation transforms of the model's data (``load_data``'s) or of the weights
    it was loaded with: resize the shorter side to ``resize_size``, centre-crop
    ``crop_size``, normalise by ``mean`` and ``std`` (None: not known)."""

    resize_size: int | None
    crop_size: int | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None


def of_pipelines(built: Pipelines) -> Preprocessing:
    """What ``load_data`` built the model's data with (its ``size``, the weights'
    normalisation)."""
    return Preprocessing(built.resize, built.size, built.mean, built.std)


def preprocessing_of(loaded: LoadedModel | None) -> Preprocessing | None:
    info = loaded.info if loaded is not None else None
    if info is None or (info.crop_size, info.mean, info.std) == (None, None, None):
        return None
    return Preprocessing(info.resize_size, info.crop_size, info.mean, info.std)


def labels_of(
    model: nn.Module,
    loaded: LoadedModel | None,
    width: int,
    given: tuple[str, ...] | None = None,
) -> tuple[str, ...] | None:
    """The class names of the model's ``width`` outputs: those the session was given
    (``labels=``, ``load_data``'s class folders), a Hugging Face config's ``id2label``,
    else the categories of the weights it was loaded with; None when none names as many
    classes as the model has outputs (a replaced head without names)."""
    if given is not None and len(given) == width:
        return given
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if isinstance(id2label, Mapping) and len(id2label) == width:
        return tuple(str(id2label[i]) for i in range(width))
    if loaded is not None and loaded.categories and len(loaded.categories) == width:
        return tuple(loaded.categories)
    return None


def fields(
    labels: tuple[str, ...] | None,
    preprocessing: Preprocessing | None,
    sample_shape: tuple[int, ...],
    dtype: str,
) -> dict[str, str]:
    """The text stored in the file, key by key."""
    return {
        LABELS: json.dumps(list(labels) if labels is not None else None),
        PREPROCESSING: json.dumps(asdict(preprocessing) if preprocessing is not None else None),
        INPUT: json.dumps({"shape": ["batch", *sample_shape], "dtype": dtype}),
        PRODUCER: json.dumps(f"torchmagic {__version__}"),
    }
