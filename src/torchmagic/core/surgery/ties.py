"""Tied parameters: one tensor reached under several names (a language model's decoder
sharing the embedding's weight, a module registered at two places).

``requires_grad`` and optimizer membership belong to the tensor, not to a name, so an
edit of one user changes every other. The rule: a shared tensor keeps training, and
stays in the optimizer, while any user outside the edited modules trains; the output
names the tie.

A module registered at two places (``self.b = self.a``) is one module, not two users:
freezing it under either name freezes it, once (:class:`Inside`). Replacing a module at
one place is different: its other place keeps the old one (``by_module=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Tie:
    """A parameter of the edited modules that other modules use too."""

    param: nn.Parameter
    inside: tuple[str, ...]  # its names among the edited modules
    outside: tuple[str, ...]  # its names elsewhere in the model

    @property
    def other_modules(self) -> str:
        """The other users by module name: ``embed`` for ``embed.weight``."""
        return _modules(self.outside)

    @property
    def own_modules(self) -> str:
        """The edited modules that hold it, by name."""
        return _modules(self.inside)

    def describe(self) -> str:
        return f"{self.inside[0]} is tied to {', '.join(self.outside)}"


def _modules(names: Sequence[str]) -> str:
    return ", ".join(dict.fromkeys(n.rpartition(".")[0] or n for n in names))


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


class Inside:
    """Which positions of the model belong to the edited (name, module, recurse) blocks,
    by module identity: a position under a block reached by any of the block's names
    (its own name or another registration of the same module object)."""

    def __init__(self, model: nn.Module, blocks: Sequence[tuple[str, nn.Module, bool]]) -> None:
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.recursive = {id(m) for _, m, recurse in blocks if recurse}
        self.own = {id(m) for _, m, recurse in blocks if not recurse}

    def module(self, path: str) -> bool:
        """Whether the module at ``path`` is edited (its own parameters included)."""
        if id(self.modules[path]) in self.own:
            return True
        parts = path.split(".") if path else []
        return any(
            id(self.modules[".".join(parts[:i])]) in self.recursive for i in range(len(parts) + 1)
        )

    def parameter(self, name: str) -> bool:
        """Whether the parameter at qualified ``name`` belongs to an edited module."""
        return self.module(name.rpartition(".")[0])


def find(
    model: nn.Module,
    blocks: Iterable[tuple[str, nn.Module, bool]],
    sharing: tuple[frozenset[int], bool],
    *,
    by_module: bool = False,
) -> list[Tie]:
    """Parameters of the edited (name, module, recurse) ``blocks`` that also have a name
    outside them: a module that is not being edited uses them too. ``sharing``: the
    model's modules registered twice and whether it ties parameters (``ModelWalk``).
    ``by_module``: a name reached through another registration of an edited module is
    inside (an edit of the module itself, such as a freeze); without it names decide (a
    replacement at one place)."""
    again, tied = sharing
    if not again and not tied:
        return []
    blocks = list(blocks)
    is_inside: Callable[[str], bool]
    if by_module:
        is_inside = Inside(model, blocks).parameter
    else:
        is_inside = inside_names(blocks).__contains__
    found = []
    for p, names in _names(model).values():
        mine = tuple(n for n in names if is_inside(n))
        others = tuple(n for n in names if not is_inside(n))
        if mine and others:
            found.append(Tie(p, mine, others))
    return found
