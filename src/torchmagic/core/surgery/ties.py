"""Tied parameters: one tensor reached under several names (a language model's decoder
sharing the embedding's weight, a module registered at two places).

``requires_grad`` and optimizer membership belong to the tensor, not to a name, so an
edit of one user changes every other. The rule: a shared tensor keeps training, and
stays in the optimizer, while any user outside the edited modules trains; the output
names the tie.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Tie:
    """A parameter of the edited modules that other modules use too."""

    param: nn.Parameter
    inside: tuple[str, ...]  # its names among the edited modules
    outside: tuple[str, ...]  # its names elsewhere in the model

    def describe(self) -> str:
        return f"{self.inside[0]} is tied to {', '.join(self.outside)}"


def _names(model: nn.Module) -> dict[int, tuple[nn.Parameter, list[str]]]:
    """Every qualified name of each parameter, by identity (a tied one has several)."""
    names: dict[int, tuple[nn.Parameter, list[str]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), (p, []))[1].append(name)
    return names


def inside_names(blocks: Iterable[tuple[str, nn.Module, bool]]) -> set[str]:
    """The qualified parameter names under (name, module, recurse) blocks, every name of
    a tied parameter included."""
    return {
        n
        for name, module, recurse in blocks
        for n, _ in module.named_parameters(prefix=name, recurse=recurse, remove_duplicate=False)
    }


def find(model: nn.Module, inside: set[str]) -> list[Tie]:
    """Parameters named in ``inside`` (the edited modules) that also have a name outside
    it: a module that is not being edited uses them too."""
    found = []
    for p, names in _names(model).values():
        mine = tuple(n for n in names if n in inside)
        others = tuple(n for n in names if n not in inside)
        if mine and others:
            found.append(Tie(p, mine, others))
    return found
