"""The one exception the engine raises for bad input."""

from __future__ import annotations


class TorchMagicError(ValueError):
    """A command was refused: the input is wrong and nothing was changed.

    The message speaks Python, not magic syntax: ``param`` names the Python parameter at
    fault (``"epochs"``), and the magics layer maps it to the flag (``--epochs``) and adds
    the usage line. The magics layer turns it into IPython's ``UsageError`` (one line, no
    traceback); scripts see an ordinary ``ValueError``.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
