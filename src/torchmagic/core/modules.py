"""Walking a module tree: wrappers seen through, unique parameters, BatchNorm kinds."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .integrations import peft

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)
# Attribute paths from a wrapper to the model it wraps, as a user may write them in a
# target (``model.module.fc``, ``peft_model.base_model.model.blocks.3``).
WRAPPER_PATHS = (("module",), ("_orig_mod",), peft.WRAPPER_PATH)


def wrapper_chain(module: nn.Module) -> Iterator[nn.Module]:
    """``module``, then each model it wraps: ``torch.compile``'s ``_orig_mod``,
    (Distributed)DataParallel's ``.module``, FSDP1's ``_fsdp_wrapped_module``, a
    PeftModel's tuner (``base_model``) and the tuner's ``model``."""
    while True:
        yield module
        inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(module, "_fsdp_wrapped_module", None)
        if not isinstance(inner, nn.Module):
            inner = peft.inner(module)
        if isinstance(inner, nn.Module):
            module = inner
        elif isinstance(module, _WRAPPERS):
            module = module.module
        else:
            return


def unwrap(module: nn.Module) -> nn.Module:
    """The user's real model behind ``torch.compile``, (Distributed)DataParallel, FSDP1
    and PEFT."""
    *_, real = wrapper_chain(module)
    return real


def wrapper_prefix(model: nn.Module, parts: Sequence[str]) -> int:
    """How many leading ``parts`` of a path into the real ``model`` only walk through
    wrappers (``module.``, ``_orig_mod.``, ``base_model.model.``), repeatedly; a name
    the model itself has is never skipped."""
    skipped = 0
    while True:
        rest = parts[skipped:]
        step = next(
            (
                len(path)
                for path in WRAPPER_PATHS
                if tuple(rest[: len(path)]) == path and path[0] not in model._modules
            ),
            0,
        )
        if not step:
            return skipped
        skipped += step


def walk(model: nn.Module) -> Iterator[nn.Module]:
    """Every module once, in registration order: ``model.modules()`` without its nested
    generators, which dominate the cost of counting a 700-module model."""
    seen: set[int] = set()
    stack: list[nn.Module | None] = [model]
    while stack:
        module = stack.pop()
        if module is None or id(module) in seen:  # None: a child slot left empty
            continue
        seen.add(id(module))
        yield module
        if module._modules:
            stack.extend(reversed(module._modules.values()))


@dataclass(frozen=True)
class ModelWalk:
    """A model as one walk found it. A surgery command walks its model once before it
    changes anything and hands this to every step that asks about the whole model."""

    modules: tuple[tuple[str, nn.Module], ...]  # each once, by its first path, in pre-order
    parameters: tuple[nn.Parameter, ...]  # each once, in the order of ``model.parameters()``
    # ids of the modules registered at more than one place, and whether a parameter is held
    # by more than one module: models without either (nearly all) skip naming ties
    sharing: tuple[frozenset[int], bool]
    # each module's child table as the walk read it, by the module's id: resolving a target
    # reads these instead of the model's own tables
    tables: Mapping[int, Mapping[str, nn.Module | None]] = field(repr=False, compare=False)

    # where each path starts in ``modules`` (filled at the first ``subtree``)
    positions: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def children(self, module: nn.Module) -> Mapping[str, nn.Module | None]:
        """``module``'s child table as the walk read it (its own table if the walk did
        not reach it)."""
        return self.tables.get(id(module), module._modules)

    def subtree(self, path: str, module: nn.Module) -> list[tuple[str, nn.Module]] | None:
        """``module`` (at ``path``) and the modules under it as the walk found them, in
        pre-order: a block's modules without walking it again. None when the walk cannot
        tell: ``path`` held another module then, or a module is registered at several
        places (the walk lists it once, maybe outside the block)."""
        if self.sharing[0]:
            return None
        if not self.positions:
            self.positions.update((name, i) for i, (name, _) in enumerate(self.modules))
        start = self.positions.get(path)
        if start is None or self.modules[start][1] is not module:
            return None
        end = len(self.modules)
        if path:
            prefix = path + "."
            end = start + 1
            while end < len(self.modules) and self.modules[end][0].startswith(prefix):
                end += 1
        return list(self.modules[start:end])


def walk_model(model: nn.Module) -> ModelWalk:
    """``model``'s :class:`ModelWalk`, from one stack (``named_modules`` without its nested
    generators, which dominate the cost on a 700-module model)."""
    seen: set[int] = set()
    again: set[int] = set()
    modules: list[tuple[str, nn.Module]] = []
    parameters: dict[int, nn.Parameter] = {}
    tables: dict[int, Mapping[str, nn.Module | None]] = {}
    held = 0
    stack: list[tuple[str, nn.Module | None]] = [("", model)]
    while stack:
        path, module = stack.pop()
        if module is None:  # a child slot left empty
            continue
        if id(module) in seen:
            again.add(id(module))
            continue
        seen.add(id(module))
        modules.append((path, module))
        for p in module._parameters.values():
            if p is not None:
                held += 1
                parameters.setdefault(id(p), p)
        table = tables[id(module)] = dict(module._modules)
        if table:
            prefix = f"{path}." if path else ""
            stack.extend((prefix + k, m) for k, m in reversed(table.items()))
    return ModelWalk(
        tuple(modules),
        tuple(parameters.values()),
        (frozenset(again), held > len(parameters)),
        tables,
    )


def unique_parameters(modules: Iterable[nn.Module], recurse: bool = True) -> list[nn.Parameter]:
    """Parameters of several modules, each once (tied weights counted once), in the order
    of ``module.parameters()``, from one :func:`walk` each (without its nested generators)."""
    seen: set[int] = set()
    out: list[nn.Parameter] = []
    for module in modules:
        # a leaf (most blocks of a long Sequential) needs no walk
        for m in walk(module) if recurse and module._modules else (module,):
            for p in m._parameters.values():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


def parameter_names(model: nn.Module) -> dict[int, str]:
    """Qualified name of each parameter by identity (the first name of a tied one)."""
    return {id(p): name for name, p in model.named_parameters()}


def frozen_batchnorm_class() -> type | None:
    """torchvision's FrozenBatchNorm2d if torchvision has defined it, else None: a model can
    hold one only then, so checking never imports torchvision (seconds, for timm or
    transformers users)."""
    misc = sys.modules.get("torchvision.ops.misc")
    return getattr(misc, "FrozenBatchNorm2d", None)


def is_frozen_batchnorm(module: nn.Module) -> bool:
    frozen = frozen_batchnorm_class()
    return frozen is not None and isinstance(module, frozen)


def is_batchnorm(module: nn.Module) -> bool:
    return isinstance(module, _BatchNorm) or is_frozen_batchnorm(module)


def parent_of(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The parent module and attribute name of the submodule at qualified ``name``."""
    parent_name, _, attr = name.rpartition(".")
    return (root.get_submodule(parent_name) if parent_name else root), attr
