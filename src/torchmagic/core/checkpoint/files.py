"""Writing a checkpoint atomically and reading one back with ``weights_only=True``."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Iterator

import torch

from .. import torch_files
from ..errors import TorchMagicError
from ..surgery.transaction import uninterrupted
from . import integrity
from .records import FORMAT, VERSION


def write(payload: dict, path: str | os.PathLike, *, sync: bool = False) -> int:
    """``torch.save`` into a temporary file beside ``path``, then renamed over it: ``path``
    is the old file or the whole new one, never a part (Ctrl-C, a full disk, a killed
    process). A symlink is followed (its target is replaced, the link stays); the file's
    mode is what ``torch.save`` would give it (the old file's, else the umask's), so a
    cluster's group can read it. ``sync``: ``fsync`` the file and its folder first, so the
    new file also survives a power loss (on a local disk that doubles the time of a large
    save). Returns the size."""
    shown = os.path.expanduser(os.fspath(path))
    path = os.path.realpath(shown)  # a link's target, which the rename replaces
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise TorchMagicError(f"cannot save to '{shown}': no folder '{folder}'", param="path")
    if os.path.isdir(path):
        raise TorchMagicError(f"cannot save to '{shown}': it is a folder", param="path")
    made: list[str] = []  # the temporary file, named as soon as it exists
    try:
        _temporary(folder, path, made)
        temporary = made[0]
        with _crc32_on():
            torch.save(payload, temporary)  # by name: torch's own file writer, no Python stream
        if sync:
            _fsync(temporary, os.O_RDONLY)
        os.replace(temporary, path)
    except BaseException as exc:
        for name in made:
            with contextlib.suppress(OSError):
                os.unlink(name)
        reason = _write_failure(exc, folder)
        if reason is None:
            raise
        kept = "the old file is kept" if os.path.exists(path) else "nothing was written"
        raise TorchMagicError(f"cannot save to '{shown}': {reason}; {kept}") from None
    if sync:
        with contextlib.suppress(OSError):  # the rename itself, on file systems that allow it
            _fsync(folder, os.O_RDONLY)
    return os.path.getsize(path)


def _mode(path: str) -> int:
    """The permissions ``open(path, "wb")`` leaves: an existing file keeps its own, a new
    one gets 0o666 less the umask (which Python reads only by setting it and putting it
    back)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0o22)
        os.umask(umask)
        return 0o666 & ~umask


def _temporary(folder: str, path: str, made: list[str]) -> None:
    """A new empty file in ``folder`` with the mode ``path`` would get, its name appended
    to ``made`` with Ctrl-C held: an interrupt comes once the caller can remove it, never
    before (nor between reading the umask and putting it back)."""

    def make() -> None:
        mode = _mode(path)
        fd, name = tempfile.mkstemp(prefix=".tm-save-", suffix=".tmp", dir=folder)
        made.append(name)
        try:
            os.fchmod(fd, mode)  # mkstemp's 0o600 would hide the file from the group
        finally:
            os.close(fd)

    uninterrupted(make)


# how torch's C++ zip writer (inline_container.cc) words a failed write or close
_TORCH_WRITER_FAILED = ("file write failed", "PytorchStreamWriter", "inline_container")


def _write_failure(exc: BaseException, folder: str) -> str | None:
    """Why the file system refused the write (a full disk, a quota, permissions), in
    words; None for anything else (Ctrl-C goes on as itself). torch's own writer raises a
    RuntimeError without the OS's reason: the space left on that disk says it."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in _TORCH_WRITER_FAILED):
        free = shutil.disk_usage(folder).free
        return f"the write failed with {free / (1 << 20):.1f} MiB free on that disk"
    return None


@contextlib.contextmanager
def _crc32_on() -> Iterator[None]:
    """torch's writer with its CRC-32s, which :func:`read` checks (a process may have
    turned them off with ``torch.serialization.set_crc32_options``)."""
    options = torch.serialization
    if not hasattr(options, "get_crc32_options") or options.get_crc32_options():
        yield
        return
    options.set_crc32_options(True)
    try:
        yield
    finally:
        options.set_crc32_options(False)


def _zip_damage(path: str) -> str | None:
    """Where the file's zip structure or one of its records that are not tensors (the
    pickled structure, torch's version and byte-order records) fails its CRC-32, in words;
    None when all hold. Tensor records are left to the digests, which cost one pass over
    the weights where a CRC would cost another."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                with archive.open(info) as record:  # checks the local header
                    if "/data/" in f"/{info.filename}":
                        continue
                    crc = zlib.crc32(record.read())
                if crc != info.CRC:
                    return f"the file is damaged: its record '{info.filename}' fails its checksum"
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        return f"the file is damaged: its zip structure is unreadable ({exc})"
    return None


def _fsync(path: str, flags: int) -> None:
    handle = os.open(path, flags)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def read(path: str | os.PathLike) -> dict:
    """The checkpoint at ``path``, loaded with ``weights_only=True`` onto the CPU and
    memory-mapped (weights are copied once, into the model; see :func:`_owned`) and
    verified, every byte, before any of it is used; a file that is missing, damaged,
    truncated, not torch's or not ours is refused in one line."""
    path = os.path.expanduser(os.fspath(path))
    where = f"cannot resume from '{path}'"
    missing = torch_files.not_a_file(path)
    if missing is not None:
        raise TorchMagicError(f"{where}: {missing}", param="path")
    if zipfile.is_zipfile(path):  # else torch's refusal says what it is
        damaged = _zip_damage(path)
        if damaged is not None:
            raise TorchMagicError(f"{where}: {damaged}; nothing was changed", param="path")
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
    damaged = integrity.damage(payload)
    if damaged is not None:
        raise TorchMagicError(f"{where}: {damaged}; nothing was changed", param="path")
    return payload
