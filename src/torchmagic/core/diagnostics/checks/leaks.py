"""Graphs kept alive: lists and dicts of losses stored with their autograd graph."""

from __future__ import annotations

from collections.abc import Iterator

from ...tensors import leaves
from ..context import DoctorContext
from ..findings import Finding
from ..registry import CheckGroup

checks = CheckGroup()

# How many items of a list / dict in the namespace are searched for graph-holding tensors
# (the newest ones: a leak appends).
LEAK_SCAN_ITEMS = 10_000


def _graph_tensors(value: object) -> int:
    """Tensors with a grad_fn in a list or dict of tensors (or of lists / dicts of them),
    among its newest entries."""
    found = leaves(value, depth=2, max_items=LEAK_SCAN_ITEMS, newest=True)
    return sum(t.grad_fn is not None for t in found)


@checks.namespace
def graph_leaks(context: DoctorContext) -> Iterator[Finding]:
    for name, value in context.ws.items():
        if not isinstance(value, (list, tuple, dict)):
            continue
        found = _graph_tensors(value)
        if found:
            yield Finding(
                "graph-leak",
                "warning",
                name,
                f"{name} keeps {found} tensor(s) with a grad_fn: each keeps its whole autograd "
                "graph (activations) alive, so memory grows every step",
                f"store loss.item() (or loss.detach()) in {name}, and rebuild it from "
                "such values to free what it holds now",
            )
