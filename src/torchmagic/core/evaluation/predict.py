"""Predicting classes for new inputs with the model's evaluation transforms, never the
training augmentation.

An input is an image file, a folder of images, a PIL image or a tensor. Images go through
the evaluation transforms (the caller's, else those torchmagic knows for the model: the
weights' ``transforms()``, or the transform of a loader that does not augment); a tensor
is taken as the model's input already, unless transforms are given: ``[C, H, W]`` or
``[D]`` one input, ``[N, C, H, W]`` or ``[N, D]`` a batch. The model runs as an
evaluation does (:mod:`.running`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import TorchMagicError, first_line
from ..training.amp import AmpController
from ..training.data import to_device
from .running import frozen_state, outputs


@dataclass(frozen=True)
class PredictOptions:
    """How to predict: the ``top`` classes to report for each input, and ``transforms``
    (a callable, or the variable holding one) instead of the ones the session knows."""

    top: int = 5
    transforms: Callable | str | None = None


@dataclass(frozen=True)
class Prediction:
    """The classes of one input, best first, with their probabilities (softmax);
    ``source``: the file or what the input was."""

    source: str
    labels: tuple[str, ...]
    probabilities: tuple[float, ...]

    @property
    def label(self) -> str:
        """The predicted class."""
        return self.labels[0]


@dataclass(frozen=True)
class Predictions:
    """The predictions for several inputs (a folder, a batch), in order."""

    model_name: str
    items: tuple[Prediction, ...]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Prediction:
        return self.items[index]


def check_options(options: PredictOptions) -> None:
    top = options.top
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise TorchMagicError(f"top must be a positive whole number, got {top!r}", param="top")


# A folder to predict on is a folder of images, not a disk: the scan stops here.
MAX_FILES = 100_000


def image_files(folder: Path) -> list[Path]:
    """The images in ``folder`` and below, sorted (torchvision's image suffixes). A folder
    that cannot be read, or that holds more than ``MAX_FILES`` files, is refused."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    def unreadable(error: OSError) -> None:
        raise TorchMagicError(f"cannot read {error.filename}: {error.strerror}", param="input")

    found: list[Path] = []
    seen = 0
    for parent, _, names in os.walk(folder, onerror=unreadable):
        seen += len(names)
        if seen > MAX_FILES:
            raise TorchMagicError(
                f"{folder} holds over {MAX_FILES:,} files: give a folder of images "
                "(for a whole dataset, %evaluate with a DataLoader)",
                param="input",
            )
        found += [Path(parent, n) for n in names if Path(n).suffix.lower() in IMG_EXTENSIONS]
    return sorted(found)


def inputs_of(value: object) -> tuple[list[tuple[str, Any]], bool]:
    """(source, input) pairs for ``value``, and whether it was one input (not a folder or
    a batch). A path is a file or a folder of images; refused in one line otherwise."""
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        try:
            folder, file = path.is_dir(), path.is_file()
        except OSError as error:  # a name too long for the file system, say
            shown = str(path) if len(str(path)) <= 60 else f"{str(path)[:57]}…"
            raise TorchMagicError(
                f"cannot look up '{shown}': {error.strerror or error}", param="input"
            ) from None
        if folder:
            files = image_files(path)
            if not files:
                raise TorchMagicError(f"no image files in the folder {path}", param="input")
            return [(str(f), f) for f in files], False
        if not file:
            raise TorchMagicError(
                f"'{value}' is neither a variable nor a file or folder", param="input"
            )
        return [(str(path), path)], True
    if isinstance(value, torch.Tensor):
        if value.ndim in (2, 4):  # a batch of vectors or of images
            return [(f"tensor[{i}]", t) for i, t in enumerate(value)], False
        if value.ndim in (1, 3):
            return [("tensor", value)], True
        raise TorchMagicError(
            f"a tensor input is one sample or a batch, got shape {tuple(value.shape)}",
            param="input",
        )
    if type(value).__module__.startswith("PIL"):
        return [(f"{type(value).__name__} {getattr(value, 'size', '')}", value)], True
    raise TorchMagicError(
        "input must be an image path, a folder of images, a PIL image or a tensor, got "
        f"a {type(value).__name__}",
        param="input",
    )


def prepared(source: Any, transform: Callable | None) -> torch.Tensor:
    """One input as the model takes it: images opened as RGB and transformed."""
    if isinstance(source, torch.Tensor):
        return source if transform is None else transform(source)
    if transform is None:
        raise TorchMagicError(
            "no evaluation transforms are known for this model: give transforms= (e.g. "
            "the weights' transforms())",
            param="transforms",
        )
    if isinstance(source, Path):
        from PIL import Image

        try:
            with Image.open(source) as opened:
                source = opened.convert("RGB")
        except OSError as error:
            raise TorchMagicError(
                f"cannot read {source} as an image: {error}", param="input"
            ) from None
    elif getattr(source, "mode", "RGB") != "RGB":
        source = source.convert("RGB")
    result = transform(source)
    if not isinstance(result, torch.Tensor):
        raise TorchMagicError(
            f"the transforms give a {type(result).__name__}, not a tensor", param="transforms"
        )
    return result


def predict(
    model: nn.Module,
    model_name: str,
    sources: Sequence[tuple[str, Any]],
    transform: Callable | None,
    device: torch.device,
    *,
    amp: AmpController,
    labels: Callable[[int], tuple[str, ...]],
    top: int,
) -> Predictions:
    """The ``top`` classes of each input; the model and every random state as before."""
    batch = torch.stack([prepared(source, transform) for _, source in sources])
    with frozen_state(model):
        try:
            scores = outputs(model, to_device(batch, device, False), amp)
        except torch.OutOfMemoryError:
            raise
        except (TypeError, ValueError, RuntimeError, IndexError) as error:
            raise TorchMagicError(
                f"'{model_name}' cannot run on inputs of shape {list(batch.shape)}: "
                f"{first_line(error)}",
                param="input",
            ) from error
        if not isinstance(scores, torch.Tensor) or scores.ndim != 2:
            raise TorchMagicError(
                "predict reads classifiers: outputs of shape [batch, classes]", param="model"
            )
        probabilities = scores.float().softmax(dim=1).cpu()
    names = labels(probabilities.shape[1])
    best, order = probabilities.topk(min(top, probabilities.shape[1]), dim=1)
    return Predictions(
        model_name,
        tuple(
            Prediction(source, tuple(names[i] for i in idx.tolist()), tuple(p.tolist()))
            for (source, _), p, idx in zip(sources, best, order, strict=True)
        ),
    )
