"""How the commands inside a fix are spelled in what is drawn now: in Python by default
(``tm.freeze(...)``); the magics draw with their own spelling (``%freeze ...``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..core.advice import Advice, Spelling, python, spelled

_SPELL: ContextVar[Spelling] = ContextVar("torchmagic_spell", default=python)


@contextmanager
def calls_spelled(spell: Spelling) -> Iterator[None]:
    """Within the block, fixes name their commands as ``spell`` writes them."""
    token = _SPELL.set(spell)
    try:
        yield
    finally:
        _SPELL.reset(token)


def fix_text(advice: str | Advice) -> str:
    return spelled(advice, _SPELL.get())
