"""The fixes the engine suggests: text with the session commands in it kept as values,
so each front end spells them its own way (``tm.freeze("model.layer1")`` in a script,
``%freeze model.layer1`` in a notebook, where no ``tm`` exists)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .numbers import short


@dataclass(frozen=True)
class Call:
    """A session command a fix suggests, as the Session method and its arguments."""

    method: str  # freeze, unfreeze, replace_head, amp_on, move, undo, lr_find
    args: tuple[str | int, ...] = ()
    # (name, value): a value each spelling writes its own way (("bn", "frozen") →
    # bn="frozen" / --bn frozen; ("exclude", ("fc",)) → exclude=("fc",) / --except fc);
    # PLACEHOLDER stands for a value the user picks (lr=…)
    options: tuple[tuple[str, object], ...] = ()
    more: bool = False  # the targets were cut short: "…" follows them
    mention: bool = False  # named in prose ("tm.move moves it"), not called

    def python(self) -> str:
        if self.mention:
            return f"tm.{self.method}"
        words = [f'"{a}"' if isinstance(a, str) else str(a) for a in self.args]
        words += ["…"] if self.more else []
        words += [f"{name}={_python(value)}" for name, value in self.options]
        return f"tm.{self.method}({', '.join(words)})"


PLACEHOLDER = "…"


@dataclass(frozen=True)
class Option:
    """An option a fix names with its value (``optimizer=NAME``, ``force=True``), kept as
    a value so each front end writes it its own way (``--opt NAME``, ``--force``)."""

    name: str
    value: object = ""

    def python(self) -> str:
        return f"{self.name}={self.value}"


def _python(value: object) -> str:
    """A value as a Python call writes it; floats short (``0.025``, not ``0.0250000001``;
    ``1e-5``, not ``1e-05``)."""
    if isinstance(value, str):
        return value if value == PLACEHOLDER else f'"{value}"'
    if isinstance(value, float):
        return short(value)
    if isinstance(value, tuple):
        inner = ", ".join(f'"{v}"' if isinstance(v, str) else _python(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


Advice = tuple[str | Call | Option, ...]
# A history entry's command: the line a magic passed as typed, or the session call.
Command = str | Advice


Spelling = Callable[[Call | Option], str]


def python(part: Call | Option) -> str:
    """A command or an option as Python writes it (``tm.freeze("fc")``, ``force=True``)."""
    return part.python()


def spelled(advice: str | Advice, spell: Spelling = python) -> str:
    """The advice as one line, each command and option spelled by ``spell`` (plain text
    is advice without commands)."""
    return "".join(part if isinstance(part, str) else spell(part) for part in as_advice(advice))


def as_advice(text: str | Advice) -> Advice:
    return (text,) if isinstance(text, str) else text


class Advised:
    """A result record with an ``advice`` field and its ``fix`` as one line in Python,
    for scripts and tests."""

    advice: str | Advice

    @property
    def fix(self) -> str:
        return spelled(self.advice)
