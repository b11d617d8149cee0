"""Which model an EMA copy belongs to. Two models of one architecture each with its EMA
copy look alike by structure, so an edit of one must not rewrite the other's copy (its
next ``update`` would crash). Ownership is decided once per copy, first sight wins, and
kept for the copy's life:

1. the only model in the namespace shaped like the copy;
2. the one model whose parameter values the copy equals (a deep copy not yet updated);
3. the one model whose variable name is a word of the copy's path (``ema_a`` → ``a``);

else the copy is ambiguous and a command that would edit it refuses, asking to name it."""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping

import torch
from torch import nn

from .modules import unwrap


def parameter_shapes(model: nn.Module) -> dict[str, tuple[int, ...] | None]:
    """Each parameter's shape by qualified name (None while a lazy module has none yet):
    the structure an EMA copy must share."""
    return {
        name: None if isinstance(p, nn.parameter.UninitializedParameter) else tuple(p.shape)
        for name, p in model.named_parameters()
    }


def _same_values(copy: nn.Module, model: nn.Module) -> bool:
    with torch.no_grad():
        return all(
            a.device == b.device and torch.equal(a, b)
            for a, b in zip(copy.parameters(), model.parameters(), strict=True)
        )


def _words(path: str) -> set[str]:
    return set(re.split(r"[^0-9A-Za-z]+|_", path))


class EmaOwners:
    """The recorded owner of each EMA copy seen (weak on both sides)."""

    def __init__(self) -> None:
        self._owner: dict[int, tuple[weakref.ref, weakref.ref]] = {}

    def recorded(self, copy: nn.Module) -> nn.Module | None:
        entry = self._owner.get(id(copy))
        if entry is None or entry[0]() is not copy:
            return None
        return entry[1]()

    def copies_of(
        self,
        model: nn.Module,
        helpers: list[tuple[str, nn.Module]],
        models: Mapping[str, nn.Module],
    ) -> tuple[list[tuple[str, nn.Module]], str | None]:
        """The copies among ``helpers`` that belong to ``model``, and the refusal an edit
        of its structure gives while a copy shaped like it cannot be told apart (None:
        every copy is placed; a freeze or a fit never needs it)."""
        shapes = parameter_shapes(model)
        mine = []
        unclear = None
        for path, copy in helpers:
            real = unwrap(copy)
            if copy is model or parameter_shapes(real) != shapes:
                continue
            owner = self.recorded(copy)
            if owner is None:
                owner, why = self._decide(path, real, models)
                if owner is None:
                    unclear = unclear or why
                    continue
                self._owner[id(copy)] = (weakref.ref(copy), weakref.ref(owner))
            if owner is model:
                mine.append((path, copy))
        return mine, unclear

    def _decide(
        self, path: str, copy: nn.Module, models: Mapping[str, nn.Module]
    ) -> tuple[nn.Module | None, str]:
        shapes = parameter_shapes(copy)
        rivals = {n: unwrap(m) for n, m in models.items() if parameter_shapes(unwrap(m)) == shapes}
        if len(rivals) == 1:
            return next(iter(rivals.values())), ""
        for test in (
            lambda n, m: _same_values(copy, m),
            lambda n, m: n.split(".")[-1] in _words(path),
        ):
            hits = [m for n, m in rivals.items() if test(n, m)]
            if len(hits) == 1:
                return hits[0], ""
        names = " and ".join(f"'{n}'" for n in rivals)
        return None, (
            f"the EMA copy '{path}' is shaped like {names} and its owner cannot be told: "
            f"bind it to a name that says its model (e.g. ema_{next(iter(rivals), 'model')} "
            f"= {path}), then run the command again"
        )
