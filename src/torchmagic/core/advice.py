"""The fixes the engine suggests: text with the session commands in it kept as values,
so each front end spells them its own way (``tm.freeze("model.layer1")`` in a script,
``%freeze model.layer1`` in a notebook, where no ``tm`` exists)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    """A session command a fix suggests, as the Session method and its arguments."""

    method: str  # freeze, unfreeze, replace_head, amp_on, move, undo
    args: tuple[str | int, ...] = ()
    options: tuple[tuple[str, str], ...] = ()  # (name, value as written), e.g. ("lr", "…")
    more: bool = False  # the targets were cut short: "…" follows them
    mention: bool = False  # named in prose ("tm.move moves it"), not called

    def python(self) -> str:
        if self.mention:
            return f"tm.{self.method}"
        words = [f'"{a}"' if isinstance(a, str) else str(a) for a in self.args]
        words += ["…"] if self.more else []
        words += [f"{name}={value}" for name, value in self.options]
        return f"tm.{self.method}({', '.join(words)})"


Advice = tuple[str | Call, ...]


def spelled(advice: str | Advice, spell: Callable[[Call], str] = Call.python) -> str:
    """The advice as one line, each command spelled by ``spell`` (plain text is advice
    without commands)."""
    parts = (advice,) if isinstance(advice, str) else advice
    return "".join(part if isinstance(part, str) else spell(part) for part in parts)


class Advised:
    """A result record with an ``advice`` field and its ``fix`` as one line in Python,
    for scripts and tests."""

    advice: str | Advice

    @property
    def fix(self) -> str:
        return spelled(self.advice)
