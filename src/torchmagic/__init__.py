"""torchmagic: IPython magics for interactive transfer learning with PyTorch.

``%load_ext torchmagic`` in a notebook; ``torchmagic.Session`` in a script. Importing
is cheap: the magics (and IPython) load only when the extension is loaded, and nothing
here touches CUDA.
"""

from __future__ import annotations

from .core import (
    Change,
    Counts,
    GroupInfo,
    HistoryEntry,
    Session,
    SessionConfig,
    SummaryReport,
    TorchMagicError,
    rewrap,
)

__version__ = "0.1.0"

__all__ = [
    "Change",
    "Counts",
    "GroupInfo",
    "HistoryEntry",
    "Session",
    "SessionConfig",
    "SummaryReport",
    "TorchMagicError",
    "__version__",
    "load_ipython_extension",
    "notebook_session",
    "rewrap",
    "unload_ipython_extension",
]


def notebook_session() -> Session:
    """The Session the magics drive in this kernel, for your own loop:
    ``tm = torchmagic.notebook_session()``, ``with tm.autocast(): ...``, ``tm.step(loss, opt)``.
    """
    from IPython import get_ipython

    shell = get_ipython()
    magics = shell.magics_manager.registry.get("TorchMagics") if shell is not None else None
    if magics is None:
        raise RuntimeError("torchmagic is not loaded here: run %load_ext torchmagic first")
    return magics.session


def load_ipython_extension(ipython) -> None:
    """Register the magics (``%load_ext torchmagic``)."""
    from .magics import TorchMagics

    # Magics.__init__ makes the shell its parent (so ipython_config.py applies) and
    # lists it in shell.configurables (so %config TorchMagics.… reaches it).
    ipython.register_magics(TorchMagics(shell=ipython))


def unload_ipython_extension(ipython) -> None:
    """Remove the magics again (``%unload_ext torchmagic``)."""
    from .magics import TorchMagics

    def ours(obj: object) -> bool:
        return isinstance(getattr(obj, "__self__", obj), TorchMagics)

    manager = ipython.magics_manager
    instance = manager.registry.get("TorchMagics")
    if instance is not None:
        instance.close()
    for table in manager.magics.values():
        for name in [n for n, f in table.items() if ours(f)]:
            del table[name]
    manager.registry.pop("TorchMagics", None)
    ipython.configurables[:] = [c for c in ipython.configurables if not ours(c)]
