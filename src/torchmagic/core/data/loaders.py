"""A folder of class folders as a training and a validation ``DataLoader``.

Built from torchvision's ``ImageFolder`` (twice over the same files: one with the
training transforms, one with the evaluation transforms) and, when the user made no
split, ``random_split`` with a seeded generator: the same folder gives the same split
in every session. The result says what was found: images per class and split, a strong
imbalance, and files whose bytes appear in both splits.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ..errors import TorchMagicError
from ..zoo import LoadedModel, WeightsInfo, describe, is_weights
from . import folders
from .transforms import Pipelines, pipelines

IMBALANCE_RATIO = 3.0  # the largest class this many times the smallest: shown as a warning
MAX_WORKERS = 8  # more loader processes rarely help a single GPU and each costs memory


@dataclass(frozen=True)
class LoadDataOptions:
    """How a folder becomes loaders. ``valid``: the fraction held out for validation
    when the folder has no train/ and val/; ``size``: the crop side (default: the
    weights'); ``workers``: loader processes (default: the machine's cores, at most 8)."""

    valid: float = 0.2
    batch: int = 32
    size: int | None = None
    workers: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class ClassCount:
    name: str
    train: int
    val: int


@dataclass(frozen=True)
class ImageFolders:
    """What ``image_folders`` built and found. ``leaks``: (train file, val file) pairs
    with the same bytes; ``imbalance``: (largest class, smallest class) of the training
    split when one is at least ``IMBALANCE_RATIO`` times the other."""

    root: Path
    presplit: bool  # train/ and val/ given; otherwise split by ``valid``
    valid: float
    classes: tuple[str, ...]
    counts: tuple[ClassCount, ...]
    train_loader: DataLoader
    val_loader: DataLoader
    pipelines: Pipelines
    workers: int
    pin_memory: bool
    leaks: tuple[tuple[str, str], ...]
    imbalance: tuple[ClassCount, ClassCount] | None
    bound: tuple[str, str] = ("train_loader", "val_loader")
    model: str | None = None  # whose weights' transforms, whose class names


def default_workers() -> int:
    """One loader process per core this process may use, at most ``MAX_WORKERS``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cores or 1, MAX_WORKERS)


def check_options(options: LoadDataOptions) -> LoadDataOptions:
    """Refuse impossible options in one line each, before any file is read."""
    if isinstance(options.valid, bool) or not 0 < options.valid < 1:
        raise TorchMagicError(
            f"valid is the fraction of images held out, between 0 and 1 (e.g. 0.2), got "
            f"{options.valid!r}",
            param="valid",
        )
    for name in ("batch", "size"):
        value = getattr(options, name)
        if value is not None and (isinstance(value, bool) or value < 1):
            raise TorchMagicError(f"{name} must be a positive integer, got {value!r}", param=name)
    if options.workers is not None and options.workers < 0:
        raise TorchMagicError(f"workers must be 0 or more, got {options.workers}", param="workers")
    return options


def _weights(weights: object) -> tuple[Callable | None, WeightsInfo | None]:
    if weights is None:
        return None, None
    if isinstance(weights, LoadedModel):
        return weights.preprocess, weights.info
    if is_weights(weights):
        return weights.transforms(), describe(weights)  # type: ignore[attr-defined]
    raise TorchMagicError(
        f"weights must be a torchvision weights member (ResNet18_Weights.DEFAULT) or None, "
        f"got {type(weights).__name__}",
        param="weights",
    )


def image_folders(
    path: str | os.PathLike,
    weights: object = None,
    *,
    cuda: bool | None = None,
    **options: Any,
) -> ImageFolders:
    """A training and a validation loader over ``path``'s class folders, transformed as
    ``weights`` expect (a torchvision weights member, or what ``Session.load_model``
    built; None: ImageNet's normalisation). ``options``: the fields of
    :class:`LoadDataOptions`. ``cuda``: whether batches go to a GPU (pinned memory
    then); default: whether CUDA is available. Refused in one line, with nothing built,
    for a missing folder, no class folders, an empty class, a bad option or an image
    that cannot be read (named)."""
    given = check_options(LoadDataOptions(**options))
    preprocess, info = _weights(weights)
    where = folders.layout(Path(path))
    from torchvision.datasets import ImageFolder

    drawn = pipelines(preprocess, info, given.size)
    train_sets = [
        ImageFolder(str(f), transform=drawn.train, allow_empty=True) for f in where.folders
    ]
    eval_sets = [ImageFolder(str(f), transform=drawn.eval, allow_empty=True) for f in where.folders]
    classes = tuple(train_sets[0].classes)
    for folder, dataset in zip(where.folders, train_sets, strict=True):
        folders.check_classes(folder, dataset.samples, classes)
    if where.presplit:
        train: Dataset = train_sets[0]
        val: Dataset = eval_sets[1]
        train_samples, val_samples = train_sets[0].samples, train_sets[1].samples
    else:
        train, val, train_samples, val_samples = _split(train_sets[0], eval_sets[0], given)
    leaks = _leaks(train_samples, val_samples)
    counts = tuple(
        ClassCount(name, t, v)
        for name, t, v in zip(
            classes,
            folders.class_counts(train_samples, len(classes)),
            folders.class_counts(val_samples, len(classes)),
            strict=True,
        )
    )
    workers = default_workers() if given.workers is None else given.workers
    pin = torch.cuda.is_available() if cuda is None else cuda
    loader: dict[str, Any] = {"batch_size": given.batch, "num_workers": workers, "pin_memory": pin}
    if workers:
        loader["persistent_workers"] = True  # an epoch does not pay for starting them again
    return ImageFolders(
        root=where.root,
        presplit=where.presplit,
        valid=given.valid,
        classes=classes,
        counts=counts,
        train_loader=DataLoader(train, shuffle=True, drop_last=False, **loader),
        val_loader=DataLoader(val, shuffle=False, **loader),
        pipelines=drawn,
        workers=workers,
        pin_memory=pin,
        leaks=leaks,
        imbalance=_imbalance(counts),
    )


def _split(
    train_set: Any, eval_set: Any, options: LoadDataOptions
) -> tuple[Dataset, Dataset, list[tuple[str, int]], list[tuple[str, int]]]:
    """The seeded split: training transforms on one part, evaluation on the other."""
    from torch.utils.data import random_split

    total = len(train_set)
    held = round(total * options.valid)
    if not 0 < held < total:
        raise TorchMagicError(
            f"valid={options.valid:g} of {total} images leaves "
            f"{'no validation' if not held else 'no training'} images: choose a fraction "
            f"that keeps both",
            param="valid",
        )
    generator = torch.Generator().manual_seed(options.seed)
    train_part, val_part = random_split(train_set, [total - held, held], generator=generator)
    train_indices, val_indices = list(train_part.indices), list(val_part.indices)
    return (
        train_part,
        Subset(eval_set, val_indices),
        [train_set.samples[i] for i in train_indices],
        [train_set.samples[i] for i in val_indices],
    )


def _leaks(train: list[tuple[str, int]], val: list[tuple[str, int]]) -> tuple[tuple[str, str], ...]:
    """(train file, val file) pairs with the same bytes; every file is read once here,
    so an unreadable one is refused by name."""
    train_paths, val_paths = [p for p, _ in train], [p for p, _ in val]
    seen: dict[str, list[str]] = defaultdict(list)
    for path, digest in zip(train_paths, folders.fingerprints(train_paths), strict=True):
        seen[digest].append(path)
    return tuple(
        (twin, path)
        for path, digest in zip(val_paths, folders.fingerprints(val_paths), strict=True)
        for twin in seen.get(digest, ())
    )


def _imbalance(counts: tuple[ClassCount, ...]) -> tuple[ClassCount, ClassCount] | None:
    largest = max(counts, key=lambda c: c.train)
    smallest = min(counts, key=lambda c: c.train)
    if smallest.train * IMBALANCE_RATIO <= largest.train:
        return largest, smallest
    return None
