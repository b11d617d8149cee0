"""Reading a folder of class folders: which layout it has, which images each class holds,
and which files cannot be read, before any loader is built.

Two layouts, as torchvision's ``ImageFolder`` reads them: ``root/train/<class>/`` with
``root/val/<class>/`` (the split is the user's), or ``root/<class>/`` (split here).
Every image is read once: its bytes are hashed (the same picture under two names in
train and val is a leak) and PIL checks the file without decoding it, so a corrupt image
is named now rather than in the middle of an epoch.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import TorchMagicError

SPLIT_FOLDERS = ("train", "val")


@dataclass(frozen=True)
class Layout:
    """Where the class folders are: ``folders`` holds one root per split that the user
    made (train, val), or the one root to split."""

    root: Path
    folders: tuple[Path, ...]

    @property
    def presplit(self) -> bool:
        return len(self.folders) == 2


def _shown(path: Path) -> str:
    return f"{path}/"


def layout(path: str | Path) -> Layout:
    """The layout of ``path``; refused in one line when it holds no class folders."""
    root = Path(path).expanduser()
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise TorchMagicError(
            f"{_shown(root)} {what}: give a folder of class folders", param="path"
        )
    train, val = (root / name for name in SPLIT_FOLDERS)
    if train.is_dir() != val.is_dir():
        have, lack = (train, val) if train.is_dir() else (val, train)
        raise TorchMagicError(
            f"{_shown(root)} has {have.name}/ but no {lack.name}/: add {_shown(lack)}<class>/ "
            f"folders, or put the class folders in {_shown(root)} to have them split",
            param="path",
        )
    folders = (train, val) if train.is_dir() else (root,)
    for folder in folders:
        if not _class_folders(folder):
            raise TorchMagicError(
                f"{_shown(folder)} has no class folders: put each class's images in "
                f"{_shown(folder)}<class>/",
                param="path",
            )
    if len(folders) == 2:
        train_classes, val_classes = (set(_class_folders(f)) for f in folders)
        if train_classes != val_classes:
            only = sorted(train_classes ^ val_classes)
            raise TorchMagicError(
                f"train/ and val/ must hold the same class folders; only one has {', '.join(only)}",
                param="path",
            )
    return Layout(root, folders)


def _class_folders(folder: Path) -> list[str]:
    from torchvision.datasets.folder import find_classes

    try:
        return find_classes(str(folder))[0]
    except FileNotFoundError:
        return []


def check_classes(folder: Path, samples: Sequence[tuple[str, int]], classes: Sequence[str]) -> None:
    """Refuse a class folder without a single image (``ImageFolder`` would index it)."""
    counts = class_counts(samples, len(classes))
    empty = [name for name, count in zip(classes, counts, strict=True) if not count]
    if empty:
        from torchvision.datasets.folder import IMG_EXTENSIONS

        raise TorchMagicError(
            f"no images in {', '.join(_shown(folder / name) for name in empty)} "
            f"(images end in {', '.join(IMG_EXTENSIONS)}): add some or remove the folder",
            param="path",
        )


def class_counts(samples: Sequence[tuple[str, int]], num_classes: int) -> list[int]:
    counts = [0] * num_classes
    for _, target in samples:
        counts[target] += 1
    return counts


def fingerprints(paths: Sequence[str]) -> list[str]:
    """Each file's content hash, refusing the first file PIL cannot read as an image."""
    from PIL import Image, UnidentifiedImageError

    hashes = []
    for path in paths:
        data = Path(path).read_bytes()
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.verify()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
            raise TorchMagicError(
                f"{path} is not a readable image ({error}): remove or replace it",
                param="path",
            ) from None
        hashes.append(hashlib.blake2b(data, digest_size=16).hexdigest())
    return hashes
