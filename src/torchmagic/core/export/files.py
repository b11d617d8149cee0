"""Where an export is written: the format named by the path's suffix, and the file put in
place atomically (written beside it under a temporary name, checked, then renamed), so
a refusal, Ctrl-C or a full disk never leaves a part of a file or a file that failed its
check."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from ..advice import Option
from ..errors import TorchMagicError
from .formats import FORMATS

SUFFIXES = (".py", *FORMATS)  # the script, then the inference formats


def destination(path: str | os.PathLike, force: bool) -> tuple[str, str]:
    """``path`` expanded, and its suffix (one of :data:`SUFFIXES`); refused in one line
    when the suffix is unknown, the path is a folder or its folder is missing, or the
    file exists without ``force``."""
    path = os.path.expanduser(os.fspath(path))
    suffix = os.path.splitext(path)[1].lower()
    where = f"cannot export to '{path}'"
    if suffix not in SUFFIXES:
        known = ", ".join(SUFFIXES)
        raise TorchMagicError(f"'{path}' must end in one of {known}", param="path")
    if os.path.isdir(path):
        raise TorchMagicError(f"{where}: it is a folder", param="path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TorchMagicError(f"{where}: no folder '{folder}'", param="path")
    if os.path.lexists(path) and not force:
        raise TorchMagicError(
            (f"{where}: the file exists; ", Option("force", True), " replaces it"), param="force"
        )
    return path, suffix


@contextlib.contextmanager
def replaced_atomically(path: str) -> Iterator[str]:
    """A temporary path beside ``path`` (same suffix) for the block to write and check;
    renamed over ``path`` when the block succeeds, removed when it fails. An ``OSError``
    becomes one line saying whether the old file is kept."""
    folder, name = os.path.split(os.path.abspath(path))
    suffix = os.path.splitext(name)[1]
    temporary = os.path.join(folder, f".tm-export-{os.getpid()}-{uuid.uuid4().hex}{suffix}")
    try:
        yield temporary
        os.replace(temporary, os.path.realpath(path))
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if not isinstance(exc, OSError):
            raise
        kept = "the old file is kept" if os.path.exists(path) else "nothing was written"
        where = f"cannot export to '{path}'"
        raise TorchMagicError(f"{where}: {exc.strerror or exc}; {kept}", param="path") from None
