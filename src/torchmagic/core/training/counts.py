"""The ceiling on whole-number options (epochs, steps, batches per step): a count past
what torch's indices hold raises ``OverflowError`` deep inside a run (``loss / accumulate``)
— in ``fine_tune`` after its freeze was applied — so every count is checked against it up
front, with the plan's other checks, before anything changes."""

from __future__ import annotations

from ..errors import TorchMagicError

MAX_COUNT = 2**31 - 1  # far beyond any run; well inside torch's int64 and float ranges


def check_ceiling(value: int | None, param: str) -> None:
    """Refuse a whole number above :data:`MAX_COUNT` (None: not given)."""
    if value is not None and value > MAX_COUNT:
        raise TorchMagicError(f"{param} must be at most {MAX_COUNT}, got {value}", param=param)
