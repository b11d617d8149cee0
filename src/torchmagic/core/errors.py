"""The one exception the engine raises for bad input."""


class TorchMagicError(ValueError):
    """A command was refused: the input is wrong and nothing was changed.

    The magics layer turns it into IPython's ``UsageError`` (one line, no traceback);
    scripts see an ordinary ``ValueError``.
    """
