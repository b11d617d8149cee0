"""Writing a checkpoint atomically and reading one back with ``weights_only=True``."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import torch

from .. import torch_files
from ..errors import TorchMagicError
from .records import FORMAT, VERSION


def write(payload: dict, path: str | os.PathLike, *, sync: bool = False) -> int:
    """``torch.save`` into a temporary file beside ``path``, then renamed over it: ``path``
    is the old file or the whole new one, never a part (Ctrl-C, a full disk, a killed
    process). ``sync``: ``fsync`` the file and its folder first, so the new file also
    survives a power loss (on a local disk that doubles the time of a large save).
    Returns the size."""
    path = os.path.expanduser(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TorchMagicError(f"cannot save to '{path}': no folder '{folder}'", param="path")
    try:
        fd, temporary = tempfile.mkstemp(prefix=".tm-save-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise TorchMagicError(f"cannot save to '{path}': {exc.strerror}", param="path") from None
    os.close(fd)
    try:
        torch.save(payload, temporary)  # by name: torch's own file writer, no Python stream
        if sync:
            _fsync(temporary, os.O_RDONLY)
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        reason = _write_failure(exc, folder)
        if reason is None:
            raise
        kept = "the old file is kept" if os.path.exists(path) else "nothing was written"
        raise TorchMagicError(f"cannot save to '{path}': {reason}; {kept}") from None
    if sync:
        with contextlib.suppress(OSError):  # the rename itself, on file systems that allow it
            _fsync(folder, os.O_RDONLY)
    return os.path.getsize(path)


def _write_failure(exc: BaseException, folder: str) -> str | None:
    """Why the file system refused the write (a full disk, a quota, permissions), in
    words; None for anything else (Ctrl-C goes on as itself). torch's own writer raises a
    RuntimeError without the OS's reason: the space left on that disk says it."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, RuntimeError) and "file write failed" in str(exc):
        free = shutil.disk_usage(folder).free
        return f"the write failed with {free / (1 << 20):.1f} MiB free on that disk"
    return None


def _fsync(path: str, flags: int) -> None:
    handle = os.open(path, flags)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def read(path: str | os.PathLike) -> dict:
    """The checkpoint at ``path``, loaded with ``weights_only=True`` onto the CPU and
    memory-mapped (weights are copied once, into the model; see :func:`_owned`); a file
    that is missing, truncated, not torch's or not ours is refused in one line."""
    path = os.path.expanduser(os.fspath(path))
    where = f"cannot resume from '{path}'"
    missing = torch_files.not_a_file(path)
    if missing is not None:
        raise TorchMagicError(f"{where}: {missing}", param="path")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001  # any file: torch raises many kinds
        raise TorchMagicError(f"{where}: {torch_files.load_refusal(exc)}", param="path") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise TorchMagicError(
            f"{where}: not a torchmagic checkpoint (written by Session.save)", param="path"
        )
    if payload.get("version") != VERSION:
        raise TorchMagicError(
            f"{where}: checkpoint format version {payload.get('version')} (this torchmagic "
            f"reads version {VERSION})",
            param="path",
        )
    return payload
