"""Resolving parsed targets to blocks of a model, with ranges, globs and ``--except``."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from ..errors import TorchMagicError
from ..modules import ModelWalk, unique_parameters, unwrap, walk, walk_model, wrapper_prefix
from .grammar import Segment, Target, is_index, is_name


@dataclass(frozen=True)
class Block:
    """A selected module; ``recurse=False`` means only its own direct parameters
    (used when ``--except`` carves a descendant out of it)."""

    name: str
    module: nn.Module
    recurse: bool = True

    def parameters(self, walked: ModelWalk | None = None) -> list[nn.Parameter]:
        """Its parameters, each once; ``walked``: the model's walk, read instead of
        walking the block when it still holds the block (see :meth:`modules`)."""
        if walked is None or not self.recurse or not self.module._modules:
            return unique_parameters([self.module], self.recurse)
        return unique_parameters(self.modules(walked), recurse=False)

    def modules(self, walked: ModelWalk | None = None) -> list[nn.Module]:
        """Its modules in pre-order; from ``walked`` (the model's walk, made before the
        command changed anything) when that can tell, else from a walk of the block."""
        if not self.recurse or not self.module._modules:
            return [self.module]
        found = None if walked is None else walked.subtree(self.name, self.module)
        return list(walk(self.module)) if found is None else [m for _, m in found]

    def named_modules(self, walked: ModelWalk | None = None) -> list[tuple[str, nn.Module]]:
        """Its modules with their paths in the model, every position of a module
        registered twice (from ``walked`` when that can tell, see :meth:`modules`)."""
        if not self.recurse:
            return [(self.name, self.module)]
        found = None if walked is None else walked.subtree(self.name, self.module)
        if found is not None:
            return found
        return list(self.module.named_modules(prefix=self.name, remove_duplicate=False))


@dataclass(frozen=True)
class Selection:
    """The blocks a command acts on, in module order, none inside another."""

    model: nn.Module
    blocks: tuple[Block, ...]
    walked: ModelWalk  # the model as the command walked it before changing anything
    scope: tuple[str, ...] = ()  # what the targets named, before ``--except`` carved it
    excluded: tuple[str, ...] = ()  # what ``--except`` kept out of ``scope``

    def parameters(self) -> list[nn.Parameter]:
        seen: set[int] = set()
        out: list[nn.Parameter] = []
        for block in self.blocks:
            for p in block.parameters(self.walked):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def modules(self) -> list[nn.Module]:
        return [m for block in self.blocks for m in block.modules(self.walked)]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name or "(whole model)" for b in self.blocks)

    @property
    def sharing(self) -> tuple[frozenset[int], bool]:
        """The model's modules registered twice and whether it ties parameters."""
        return self.walked.sharing


Children = Mapping[str, nn.Module | None]  # a module's children by name, as ``_modules`` holds them


def _child(module: nn.Module, children: Children, name: str, path: str, seg: Segment) -> nn.Module:
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


def _check_range(module: nn.Module, children: Children, path: str, seg: Segment) -> None:
    """``layer1-9`` on a ResNet: the part of the range that does not exist, and the part
    that does. Counted over the real children, so a huge range costs what they do."""
    assert seg.start is not None and seg.stop is not None
    numbers = set()
    for key in children:
        tail = key[len(seg.prefix) :] if key.startswith(seg.prefix) else ""
        if tail.isdigit() and f"{seg.prefix}{int(tail)}" == key:
            numbers.add(int(tail))
    present = sorted(n for n in numbers if seg.start <= n <= seg.stop)
    if not present or len(present) == seg.stop - seg.start + 1:
        return  # all there, or none: the plain missing-name refusal says it
    missing, edge = [], seg.start
    for n in [*present, seg.stop + 1]:
        if n > edge:
            missing.append((edge, n - 1))
        edge = n + 1
    present_runs = [(n, n) for n in present]
    gone = sum(b - a + 1 for a, b in missing)
    raise TorchMagicError(
        f"'{seg.text}' reaches past what {path or 'the model'} ({type(module).__name__}) has: "
        f"{_spans(seg.prefix, missing)} {'does' if gone == 1 else 'do'} not exist, "
        f"{_spans(seg.prefix, _merged(present_runs))} {'does' if len(present) == 1 else 'do'}"
    )


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in runs:
        if out and a == out[-1][1] + 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _spans(prefix: str, runs: list[tuple[int, int]]) -> str:
    """``layer5-9``, or ``layer0, layer5-9``: each run of numbers as the grammar writes it."""
    shown = [f"{prefix}{a}" if a == b else f"{prefix}{a}-{b}" for a, b in runs[:4]]
    return ", ".join(shown) + (", …" if len(runs) > 4 else "")


def _named_children(children: Children) -> dict[str, nn.Module]:
    """Each child once, under the first name it is registered under (as
    ``named_children``: a child registered twice is reached under its first name)."""
    seen: set[int] = set()
    named: dict[str, nn.Module] = {}
    for key, child in children.items():
        if child is not None and id(child) not in seen:
            seen.add(id(child))
            named[key] = child
    return named


def _resolve_path(
    model: nn.Module, target: Target, walked: ModelWalk | None
) -> list[tuple[str, nn.Module]]:
    """Every (qualified name, module) a dotted target stands for, ranges expanded; the
    child tables are read from ``walked`` when the command has walked the model."""
    found: list[tuple[str, nn.Module]] = [("", model)]
    for seg in target.segments:
        nxt: list[tuple[str, nn.Module]] = []
        for path, module in found:
            children = module._modules if walked is None else walked.children(module)
            if seg.is_range:
                _check_range(module, children, path, seg)
            keys: dict[int, str] | None = None  # built once per parent, not per child
            for name in seg.names():
                child = _child(module, children, name, path, seg)
                if keys is None:
                    keys = {id(c): k for k, c in _named_children(children).items()}
                key = keys[id(child)]
                nxt.append((f"{path}.{key}" if path else key, child))
        found = nxt
    return found


def _resolve_glob(walked: ModelWalk, pattern: str) -> list[tuple[str, nn.Module]]:
    hits = [(n, m) for n, m in walked.modules if n and fnmatch.fnmatchcase(n, pattern)]
    if not hits:
        names = [n for n, _ in walked.modules if n]
        tail = pattern.replace("*", "").replace("?", "").strip(".")
        close = difflib.get_close_matches(tail, names, n=3, cutoff=0.4) if tail else []
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise TorchMagicError(f"pattern '{pattern}' matches no module{hint}")
    return hits


def _leaves(walked: ModelWalk) -> list[str]:
    """The last components of the model's module paths, each once, in order."""
    return list(dict.fromkeys(n.rpartition(".")[2] for n, _ in walked.modules if n))


def suffix_hint(walked: ModelWalk, name: str) -> str:
    """What to write instead of ``name``: the module names close to its last component,
    and peft's spelling, which names every module whose path ends so."""
    close = difflib.get_close_matches(name.rpartition(".")[2], _leaves(walked), n=3, cutoff=0.5)
    if not close:
        return ""
    return (
        f"; did you mean {' or '.join(close)}? (a name, or a comma list of names as in "
        f"{close[0]},{(close[1:] or ['…'])[0]}, adapts every module whose path ends so)"
    )


def _resolve_suffixes(walked: ModelWalk, suffixes: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """Every module whose path ends with one of ``suffixes`` component by component, as
    peft matches ``target_modules``; a name that matches nothing is refused."""
    exact = set(suffixes)
    endings = tuple(f".{s}" for s in suffixes)
    hits = [(n, m) for n, m in walked.modules if n in exact or n.endswith(endings)]
    for suffix in suffixes:
        if not any(n == suffix or n.endswith(f".{suffix}") for n, _ in hits):
            raise TorchMagicError(
                f"no module path ends with '{suffix}'{suffix_hint(walked, suffix)}"
            )
    return hits


def resolve(
    model: nn.Module, target: Target, suffixes: bool = False, walked: ModelWalk | None = None
) -> list[tuple[str, nn.Module]]:
    """Modules named by one target (relative to ``model``), in the order given.
    ``suffixes`` (peft's habit, for LoRA): a dotted name that is no path from the root
    names every module whose path ends with it. ``walked``: the real model's walk, when
    the command has made it; a glob or a name ending is matched against it (a path
    without it reads only the tables along the path)."""
    model = unwrap(model)
    if target.glob is None and not target.suffixes:
        # Paths written through a wrapper (`model.module.fc`, `base_model.model.blocks.3`).
        skipped = wrapper_prefix(model, [s.text for s in target.segments])
        relative = Target(target.text, target.segments[skipped:])
        try:
            return _resolve_path(model, relative, walked)
        except TorchMagicError:
            names = [s.text for s in relative.segments]
            if not suffixes or not names or not all(is_name(n) or n.isdigit() for n in names):
                raise
            return _resolve_suffixes(walked or walk_model(model), [".".join(names)])
    walked = walked or walk_model(model)
    if target.suffixes:
        return _resolve_suffixes(walked, target.suffixes)
    assert target.glob is not None
    parts = target.glob.split(".")
    pattern = ".".join(parts[wrapper_prefix(model, parts[:-1]) :])
    try:
        return _resolve_glob(walked, pattern)
    except TorchMagicError as error:
        tail = pattern.replace("*", "").replace("?", "").strip(".")
        if not suffixes or not tail or not suffix_hint(walked, tail):
            raise
        raise TorchMagicError(
            f"pattern '{pattern}' matches no module{suffix_hint(walked, tail)}"
        ) from error


def _lineage(name: str) -> list[str]:
    """``name`` and every ancestor of it, the whole model ("") last: ``a.b`` → a.b, a, ""."""
    out = [name]
    while name:
        name = name.rpartition(".")[0]
        out.append(name)
    return out


class _Names:
    """A set of qualified module names, asked in time linear in a name's depth (not in the
    size of the set) whether it contains an ancestor or a descendant of a name."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self._above = {a for n in names for a in _lineage(n)}  # names and their ancestors

    def holds_ancestor_of(self, name: str, strict: bool = False) -> bool:
        """Whether ``name`` is within one of the names (itself one, unless ``strict``)."""
        return any(a in self.names for a in _lineage(name)[1 if strict else 0 :])

    def holds_descendant_of(self, name: str) -> bool:
        """Whether one of the names is within ``name`` (or is ``name``)."""
        return name in self._above


class _Positions:
    """Where a name sits in registration order, read from the child tables of the
    model's walk; each parent's children are indexed once, so sorting thousands of
    siblings stays linear."""

    def __init__(self, model: nn.Module, walked: ModelWalk) -> None:
        self._model = model
        self._walked = walked
        self._index: dict[int, dict[str, int]] = {}

    def __call__(self, name: str) -> tuple[int, ...]:
        position = []
        module: nn.Module | None = self._model
        for part in name.split(".") if name else ():
            assert module is not None  # a path of registered children
            children = self._walked.children(module)
            index = self._index.get(id(module))
            if index is None:
                index = self._index[id(module)] = {k: i for i, k in enumerate(children)}
            position.append(index[part])
            module = children[part]
        return tuple(position)


def select(
    model: nn.Module,
    targets: Sequence[Target],
    exclude: Sequence[Target] = (),
    suffixes: bool = False,
    walked: ModelWalk | None = None,
) -> Selection:
    """The blocks named by ``targets`` minus those named by ``exclude``.

    No targets means the whole model. Blocks come back in module order, each once, none
    nested in another; a block that contains an excluded module is split into its children.
    Linear in the number of names (each checked against sets of its ancestors).
    ``suffixes``: a dotted name that is no path names the paths ending so (:func:`resolve`).
    ``walked``: the real model's walk, when the command has made it; every name is
    resolved from it.
    """
    model = unwrap(model)
    walked = walked or walk_model(model)
    picked: dict[str, nn.Module] = {}
    for target in targets or (Target(text=""),):
        for name, module in resolve(model, target, suffixes, walked):
            picked.setdefault(name, module)
    excluded = _Names({name for t in exclude for name, _ in resolve(model, t, walked=walked)})
    chosen = _Names(set(picked))
    tops = [n for n in picked if not chosen.holds_ancestor_of(n, strict=True)]
    blocks: list[Block] = []

    def carve(name: str, module: nn.Module) -> None:
        if excluded.holds_ancestor_of(name):
            return
        if not excluded.holds_descendant_of(name):
            blocks.append(Block(name, module))
            return
        if any(True for _ in module.parameters(recurse=False)):
            blocks.append(Block(name, module, recurse=False))
        for child_name, child in _named_children(walked.children(module)).items():
            carve(f"{name}.{child_name}" if name else child_name, child)

    position = _Positions(model, walked)
    tops.sort(key=position)
    for name in tops:
        carve(name, picked[name])
    if not blocks:
        raise TorchMagicError("nothing left to act on: --except removed every selected module")
    top_names = _Names(set(tops))
    kept_out = [
        e
        for e in excluded.names
        if top_names.holds_ancestor_of(e) and not excluded.holds_ancestor_of(e, strict=True)
    ]
    kept_out.sort(key=position)
    return Selection(model, tuple(blocks), walked, tuple(tops), tuple(kept_out))
