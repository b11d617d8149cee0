"""Why a file torch is to read cannot be read, in one whole sentence: not a file (a folder,
a device such as /dev/null, nothing there), a pickle of objects or code that
``torch.load(weights_only=True)`` refuses (naming the global it met), or a truncated file
or another format. torch's own texts are several lines, or cut would end mid-word."""

from __future__ import annotations

import os
import pickle
import re

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def not_a_file(path: str) -> str | None:
    """What is at ``path`` when it is not a regular file; None when it is one."""
    if os.path.isfile(path):
        return None
    if os.path.isdir(path):
        return "it is a folder, not a file"
    if os.path.exists(path):
        return "it is not a regular file (a device or a pipe)"
    return "no such file"


def load_refusal(error: BaseException) -> str:
    """Why ``torch.load(..., weights_only=True)`` raised ``error``."""
    if isinstance(error, pickle.UnpicklingError):
        found = _GLOBAL.search(str(error))
        named = f" ({found.group(1)})" if found else ""
        return (
            f"the file holds Python objects or code{named}, which weights_only=True does "
            "not load; load it yourself only if you trust where it came from"
        )
    return "it is not a readable torch file: damaged, truncated, or in another format"
