"""The magic a notebook user types for each session command a fix suggests or the
history lists: the method's magic, its arguments, each option as the magic's own flag
(``exclude`` → ``--except fc``, ``lr`` → ``lr=1e-5:0.001``, ``apply`` → ``--apply``),
read from the manifest."""

from __future__ import annotations

from functools import cache

from ..core.advice import Call
from ..core.numbers import short
from ..manifest import load_manifest

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


@cache
def _flags(method: str) -> dict[str, str]:
    """Python parameter → what the magic ``%method`` takes for it (``exclude`` →
    ``--except``, ``lr`` → ``lr=``); empty for a method with no magic of its name."""
    for magic in load_manifest()["magics"]:
        if magic["name"] == method and magic["kind"] == "line":
            found = {a["dest"]: a["name"] for a in magic["arguments"] if "dest" in a}
            return found | {k["name"]: f"{k['name']}=" for k in magic["key_values"]}
    return {}


def _value(value: object) -> str:
    """A value as a magic line writes it: words apart, an lr range ``A:B``."""
    if isinstance(value, float):
        return short(value)
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    if isinstance(value, tuple):
        return ":".join(_value(v) for v in value)
    return str(value)


def _option(method: str, name: str, value: object) -> str:
    flag = _flags(method).get(name, f"{name}=")
    if flag.endswith("="):
        return f"{flag}{_value(value)}"
    return flag if value is True else f"{flag} {_value(value)}"


def magic_line(call: Call) -> str:
    """``%freeze model.layer1 model.fc`` for ``tm.freeze("model.layer1", "model.fc")``."""
    head = _MAGICS.get(call.method, f"%{call.method}")
    if call.mention:
        return head
    words = [str(a) for a in call.args] + (["…"] if call.more else [])
    words += [_option(call.method, name, value) for name, value in call.options]
    return " ".join([head, *words])
