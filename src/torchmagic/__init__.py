"""torchmagic: IPython magics for interactive transfer learning with PyTorch.

``%load_ext torchmagic`` in a notebook; ``torchmagic.Session`` in a script. Importing
is cheap: the magics (and IPython) load only when the extension is loaded, and nothing
here touches CUDA.
"""

from __future__ import annotations

from .core import (
    Change,
    Counts,
    EvaluateOptions,
    Evaluation,
    GroupInfo,
    HistoryEntry,
    Prediction,
    Predictions,
    PredictOptions,
    Session,
    SessionConfig,
    SummaryReport,
    TorchMagicError,
    resume,
    rewrap,
)
from .version import __version__

__all__ = [
    "Change",
    "Counts",
    "EvaluateOptions",
    "Evaluation",
    "GroupInfo",
    "HistoryEntry",
    "PredictOptions",
    "Prediction",
    "Predictions",
    "Session",
    "SessionConfig",
    "SummaryReport",
    "TorchMagicError",
    "__version__",
    "load_ipython_extension",
    "notebook_session",
    "resume",
    "rewrap",
    "unload_ipython_extension",
]


def notebook_session() -> Session:
    """The Session the magics drive in this kernel, for your own loop:
    ``tm = torchmagic.notebook_session()``, ``with tm.autocast(): ...``, ``tm.step(loss, opt)``.
    """
    from IPython import get_ipython

    from .magics import loaded

    shell = get_ipython()
    extension = loaded(shell) if shell is not None else None
    if extension is None:
        raise RuntimeError("torchmagic is not loaded here: run %load_ext torchmagic first")
    return extension.session


def load_ipython_extension(ipython) -> None:
    """Register the magics (``%load_ext torchmagic``)."""
    from .magics import TorchMagics, loaded

    if loaded(ipython) is None:
        TorchMagics.load(ipython)


def unload_ipython_extension(ipython) -> None:
    """Remove the magics, their hooks and settings again (``%unload_ext torchmagic``)."""
    from .magics import loaded

    extension = loaded(ipython)
    if extension is not None:
        extension.unload()
