"""The magic a notebook user types for each session command a fix suggests."""

from __future__ import annotations

from ..core.advice import Call

# Session methods whose magic is not ``%method``.
_MAGICS = {
    "move": "%device move",
    "undo": "%tm undo",
    "amp_on": "%amp on",
    "load": "%tm load",
    "save": "%tm save",
    "use": "%tm use",
}


def magic_line(call: Call) -> str:
    """``%freeze model.layer1 model.fc`` for ``tm.freeze("model.layer1", "model.fc")``."""
    head = _MAGICS.get(call.method, f"%{call.method}")
    if call.mention:
        return head
    words = [str(a) for a in call.args] + (["…"] if call.more else [])
    words += [f"{name}={value}" for name, value in call.options]
    return " ".join([head, *words])
