"""The one exception the engine raises for bad input."""

from __future__ import annotations

from .advice import Advice, spelled


class TorchMagicError(ValueError):
    """A command was refused: the input is wrong and nothing was changed.

    The message speaks Python, not magic syntax: ``param`` names the Python parameter at
    fault (``"epochs"``), and the magics layer maps it to the flag (``--epochs``) and adds
    the usage line. A message that suggests a command keeps it as a value (``advice``), so
    the magics layer spells it as the magic (``%tm use model``) and ``str()`` as the
    Python call. The magics layer turns it into IPython's ``UsageError`` (one line, no
    traceback); scripts see an ordinary ``ValueError``.
    """

    def __init__(self, message: str | Advice, *, param: str | None = None) -> None:
        super().__init__(spelled(message))
        self.advice = message
        self.param = param


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (its class name when it has none): what a
    one-line refusal quotes of an error raised by the user's own code."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
