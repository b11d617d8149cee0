"""The two pipelines of a data set: evaluation exactly as the model's weights expect
(their own ``transforms()``: resize, crop, normalisation), training the same size and
normalisation behind standard augmentation (a random resized crop and a flip)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..zoo import WeightsInfo

# What a network pretrained on ImageNet expects when nothing better is known.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_SIZE = 224
RESIZE_RATIO = 256 / 224  # resize before the centre crop, as torchvision's presets do


@dataclass(frozen=True)
class Pipelines:
    """The evaluation and training transforms, and what they came from (``source``:
    the weights' name; None: no known weights, ImageNet's normalisation). ``size`` is the
    crop's side, ``resize`` the shorter side before it (None: the weights' transform does
    not say)."""

    eval: Callable
    train: Callable
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str | None
    resize: int | None = None


def pipelines(preprocess: Callable | None, info: WeightsInfo | None, size: int | None) -> Pipelines:
    """Transforms for weights with ``preprocess`` (their ``transforms()``) and ``info``
    (their input size and normalisation); ``size`` overrides the crop size, which keeps
    the weights' normalisation but no longer their exact evaluation transform."""
    from torchvision import transforms

    known = preprocess is not None and info is not None and info.mean is not None
    mean = info.mean if known and info is not None and info.mean else IMAGENET_MEAN
    std = info.std if known and info is not None and info.std else IMAGENET_STD
    native = info.crop_size if known and info is not None else None
    crop = size or native or DEFAULT_SIZE
    normalize = [transforms.ToTensor(), transforms.Normalize(mean, std)]
    if known and crop == native and preprocess is not None:
        evaluation: Callable = preprocess
        resize = info.resize_size if info is not None else None
    else:
        resize = round(crop * RESIZE_RATIO)
        evaluation = transforms.Compose(
            [transforms.Resize(resize), transforms.CenterCrop(crop), *normalize]
        )
    training = transforms.Compose(
        [transforms.RandomResizedCrop(crop), transforms.RandomHorizontalFlip(), *normalize]
    )
    source = info.name if known and info is not None else None
    return Pipelines(evaluation, training, crop, tuple(mean), tuple(std), source, resize)
