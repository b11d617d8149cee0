"""Compiled models and what changed in them since torch.compile saw them.

torch does not expose what a compiled graph was traced from, so the structure a compiled
model had when torchmagic first saw it is the baseline.
"""

from __future__ import annotations

import weakref
from collections.abc import Container, MutableMapping

from torch import nn

from ..modules import unwrap
from ..workspace import Workspace


def is_compiled(module: nn.Module) -> bool:
    """``torch.compile(model)`` (an OptimizedModule) or ``model.compile()`` (in place)."""
    return isinstance(getattr(module, "_orig_mod", None), nn.Module) or (
        getattr(module, "_compiled_call_impl", None) is not None
    )


def _fingerprint(module: nn.Module) -> tuple[dict[str, int], dict[str, bool]]:
    real = unwrap(module)
    structure = {n: id(m) for n, m in real.named_modules()}
    flags = {n: p.requires_grad for n, p in real.named_parameters()}
    return structure, flags


class CompileWatch:
    """Remembers what each compiled model looked like when first seen, to tell when it
    was changed since.

    Limits: torch does not expose what a compiled graph was traced from, so "first seen"
    is the baseline: call :meth:`observe` after every cell (or before any surgery), or a
    change made before the first observation goes unnoticed. Structure (which module object
    sits at each name) and ``requires_grad`` flags are compared; weights, buffers and
    train/eval mode are not (they change on every step or by design). A change does not
    give wrong results: dynamo's guards fail and it recompiles, and past
    ``torch._dynamo.config.recompile_limit`` recompiles it silently runs eagerly.
    """

    def __init__(self) -> None:
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def observe(self, namespace: MutableMapping, hidden: Container[str] = ()) -> None:
        for _, value in Workspace(namespace, hidden).items():
            if isinstance(value, nn.Module) and is_compiled(value) and value not in self._seen:
                self._seen[value] = _fingerprint(value)

    def changes(self, module: nn.Module) -> list[tuple[str, list[str]]]:
        """What changed since ``module`` was first observed, as (kind of change, names);
        empty when nothing did or it was never observed."""
        if module not in self._seen:
            return []
        structure, flags = self._seen[module]
        now_structure, now_flags = _fingerprint(module)
        replaced = {n for n, i in now_structure.items() if structure.get(n) != i}
        removed = {n for n in structure if n not in now_structure}
        flipped = {n for n in flags.keys() & now_flags.keys() if flags[n] != now_flags[n]}
        moved = replaced | removed
        order = {n: i for i, n in enumerate([*structure, *now_structure, *now_flags])}

        def outermost(names: set[str]) -> list[str]:
            """In model order, without names inside a replaced or removed module."""
            kept = [n for n in names if not any(p in moved for p in _parents(n))]
            return sorted(kept, key=order.__getitem__)

        changed = (
            ("replaced or added", outermost(replaced)),
            ("removed", outermost(removed)),
            ("requires_grad changed on", outermost(flipped)),
        )
        return [(what, names) for what, names in changed if names]


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]
