"""Resolving parsed targets to blocks of a model, with ranges, globs and ``--except``."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from torch import nn

from ..errors import TorchMagicError
from ..modules import unwrap, wrapper_prefix
from . import ties
from .grammar import Segment, Target, is_index


@dataclass(frozen=True)
class Block:
    """A selected module; ``recurse=False`` means only its own direct parameters
    (used when ``--except`` carves a descendant out of it)."""

    name: str
    module: nn.Module
    recurse: bool = True

    def parameters(self) -> list[nn.Parameter]:
        return list(self.module.parameters(recurse=self.recurse))

    def modules(self) -> list[nn.Module]:
        return list(self.module.modules()) if self.recurse else [self.module]


@dataclass(frozen=True)
class Selection:
    """The blocks a command acts on, in module order, none inside another."""

    model: nn.Module
    blocks: tuple[Block, ...]
    scope: tuple[str, ...] = ()  # what the targets named, before ``--except`` carved it
    excluded: tuple[str, ...] = ()  # what ``--except`` kept out of ``scope``

    def parameters(self) -> list[nn.Parameter]:
        seen: set[int] = set()
        out: list[nn.Parameter] = []
        for block in self.blocks:
            for p in block.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def modules(self) -> list[nn.Module]:
        return [m for block in self.blocks for m in block.modules()]

    @cached_property
    def sharing(self) -> tuple[set[int], bool]:
        """The model's modules registered twice and whether parameters are tied
        (:func:`ties.shared_modules`), walked once per command."""
        return ties.shared_modules(self.model)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name or "(whole model)" for b in self.blocks)


def _child(module: nn.Module, name: str, path: str, seg: Segment) -> nn.Module:
    children = module._modules
    if name.startswith("-") and is_index(name) and -len(children) <= int(name):
        name = list(children)[int(name)]  # `classifier.-1`: the last child
    child = children.get(name)
    if child is None:
        where = path or "the model"
        options = [k for k in children if children[k] is not None]
        close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if not close and options:
            shown = ", ".join(options[:12]) + (", …" if len(options) > 12 else "")
            hint = f"; its children are: {shown}"
        elif not options:
            hint = f"; {where} has no child modules"
        what = f"'{seg.text}'" if seg.is_range else f"'{name}'"
        raise TorchMagicError(f"no module {what} in {where} ({type(module).__name__}){hint}")
    return child


def _resolve_path(model: nn.Module, target: Target) -> list[tuple[str, nn.Module]]:
    """Every (qualified name, module) a dotted target stands for, ranges expanded."""
    found: list[tuple[str, nn.Module]] = [("", model)]
    for seg in target.segments:
        nxt: list[tuple[str, nn.Module]] = []
        for path, module in found:
            for name in seg.names():
                child = _child(module, name, path, seg)
                key = next(k for k, v in module._modules.items() if v is child)
                nxt.append((f"{path}.{key}" if path else key, child))
        found = nxt
    return found


def _resolve_glob(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    hits = [(n, m) for n, m in model.named_modules() if n and fnmatch.fnmatchcase(n, pattern)]
    if not hits:
        names = [n for n, _ in model.named_modules() if n]
        tail = pattern.replace("*", "").replace("?", "").strip(".")
        close = difflib.get_close_matches(tail, names, n=3, cutoff=0.4) if tail else []
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise TorchMagicError(f"pattern '{pattern}' matches no module{hint}")
    return hits


def resolve(model: nn.Module, target: Target) -> list[tuple[str, nn.Module]]:
    """Modules named by one target (relative to ``model``), in the order given."""
    model = unwrap(model)
    if target.glob is not None:
        parts = target.glob.split(".")
        return _resolve_glob(model, ".".join(parts[wrapper_prefix(model, parts[:-1]) :]))
    # Paths written through a wrapper (`model.module.fc`, `base_model.model.blocks.3`) work.
    skipped = wrapper_prefix(model, [s.text for s in target.segments])
    return _resolve_path(model, Target(target.text, target.segments[skipped:]))


def _is_within(name: str, ancestor: str) -> bool:
    return ancestor == "" or name == ancestor or name.startswith(ancestor + ".")


def _position(model: nn.Module, name: str) -> tuple[int, ...]:
    """Where ``name`` sits in registration order, without walking the whole model."""
    position = []
    module: nn.Module | None = model
    for part in name.split(".") if name else ():
        assert module is not None  # a path of registered children
        keys = list(module._modules)
        position.append(keys.index(part))
        module = module._modules[part]
    return tuple(position)


def select(
    model: nn.Module, targets: Sequence[Target], exclude: Sequence[Target] = ()
) -> Selection:
    """The blocks named by ``targets`` minus those named by ``exclude``.

    No targets means the whole model. Blocks come back in module order, each once, none
    nested in another; a block that contains an excluded module is split into its children.
    """
    model = unwrap(model)
    picked: dict[str, nn.Module] = {}
    for target in targets or (Target(text=""),):
        for name, module in resolve(model, target):
            picked.setdefault(name, module)
    excluded = {name for t in exclude for name, _ in resolve(model, t)}
    tops = [n for n in picked if not any(o != n and _is_within(n, o) for o in picked)]
    blocks: list[Block] = []

    def carve(name: str, module: nn.Module) -> None:
        if any(_is_within(name, e) for e in excluded):
            return
        if not any(_is_within(e, name) for e in excluded):
            blocks.append(Block(name, module))
            return
        if any(True for _ in module.parameters(recurse=False)):
            blocks.append(Block(name, module, recurse=False))
        for child_name, child in module.named_children():
            carve(f"{name}.{child_name}" if name else child_name, child)

    tops.sort(key=lambda n: _position(model, n))
    for name in tops:
        carve(name, picked[name])
    if not blocks:
        raise TorchMagicError("nothing left to act on: --except removed every selected module")
    kept_out = [
        e
        for e in excluded
        if any(_is_within(e, t) for t in tops)
        and not any(o != e and _is_within(e, o) for o in excluded)
    ]
    kept_out.sort(key=lambda n: _position(model, n))
    return Selection(model, tuple(blocks), tuple(tops), tuple(kept_out))
