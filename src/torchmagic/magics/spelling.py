"""The magic a notebook user types for each session command a fix suggests or the
history lists: the method's magic, its arguments, each option as the magic's own flag
(``exclude`` → ``--except fc``, ``lr`` → ``lr=1e-5:0.001``, ``apply`` → ``--apply``),
read from the table of flags the magics declare."""

from __future__ import annotations

from ..core.advice import Call, Option, short
from .usage import FLAGS

# Session methods whose magic is not ``%method``.
_MAGICS = {
    "move": "%device move",
    "set_device": "%device",
    "undo": "%tm undo",
    "amp_on": "%amp on",
    "load": "%tm load",
    "save": "%tm save",
    "use": "%tm use",
}


def _value(value: object) -> str:
    """A value as a magic line writes it: words apart, an lr range ``A:B``."""
    if isinstance(value, float):
        return short(value)
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    if isinstance(value, tuple):
        return ":".join(_value(v) for v in value)
    return str(value)


def _option(flag: str, value: object) -> str:
    if flag.endswith("="):
        return f"{flag}{_value(value)}"
    return flag if value is True or value == "" else f"{flag} {_value(value)}"


def _any_flag(name: str) -> str:
    """The flag a fix's option (``optimizer=NAME``) takes in the magics that declare it."""
    return next((flags[name] for flags in FLAGS.values() if name in flags), f"{name}=")


def magic_line(part: Call | Option) -> str:
    """``%freeze model.layer1 model.fc`` for ``tm.freeze("model.layer1", "model.fc")``;
    ``--opt NAME`` for the option ``optimizer=NAME``."""
    if isinstance(part, Option):
        return _option(_any_flag(part.name), part.value)
    head = _MAGICS.get(part.method, f"%{part.method}")
    if part.mention:
        return head
    flags = FLAGS.get(part.method, {})
    words = [str(a) for a in part.args] + (["…"] if part.more else [])
    words += [_option(flags.get(name, f"{name}="), value) for name, value in part.options]
    return " ".join([head, *words])
