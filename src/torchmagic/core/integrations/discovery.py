"""The one walk that finds the user's objects where they really live.

Optimizers, schedulers, GradScalers and models sit in notebook variables, but also inside
other objects: ``learner.opt``, ``trainer.optimizers[0]``, Accelerate's wrappers around
the user's own optimizer and scheduler. The walk starts at every user variable and goes
at most two levels down: public attributes of plain objects, the items of lists, tuples
and dicts, and the members a library's integration names (a Lightning trainer's optimizers are
properties no attribute walk sees). Models, tensors, optimizers and schedulers are not
searched inside; wrappers are seen through by the attribute their library documents.
Each object is named by the path the user would type, first (shortest) path winning.
"""

from __future__ import annotations

import types
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..modules import unwrap
from ..surgery import scheduler_sync
from .classes import package_of
from .lookup import inner, integration_of, same

MAX_DEPTH = 2  # attribute levels below a variable
MAX_MEMBERS = 64  # per object: a bounded walk, also over a huge list or config object

# never searched inside: their insides are not where users keep their objects
_OPAQUE = (
    nn.Module,
    torch.Tensor,
    torch.optim.Optimizer,
    type,
    types.ModuleType,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    str,
    bytes,
    int,
    float,
    complex,
    bool,
)


@dataclass(frozen=True)
class Found:
    """One object reached from the namespace: ``value`` with wrappers seen through,
    ``held`` as the user holds it at ``path``, and ``owner`` the library object whose
    integration named it (the trainer holding an optimizer), if any."""

    path: str
    value: object
    held: object
    owner: object | None = None
    owner_path: str = ""

    @property
    def in_container(self) -> bool:
        """Reached through a list, tuple or dict item (``models['a']``)."""
        return "[" in self.path


def _members(obj: object) -> tuple[list[tuple[str, object]], list[tuple[str, object]]]:
    """What the walk looks at inside ``obj``: the members its integration names, and the list,
    tuple or dict items or the public attributes of a plain object."""
    known = integration_of(obj)
    named_by_integration = list(known.members(obj)) if known is not None else []
    out: list[tuple[str, object]] = []
    if isinstance(obj, (list, tuple)):
        out += [(f"[{i}]", v) for i, v in enumerate(obj[:MAX_MEMBERS])]
    elif isinstance(obj, dict):
        out += [(f"[{k!r}]", v) for k, v in list(obj.items())[:MAX_MEMBERS] if isinstance(k, str)]
    elif not isinstance(obj, _OPAQUE) and not scheduler_sync.is_scheduler(obj):
        try:
            attributes = vars(obj)
        except TypeError:  # no __dict__ (slots, builtins)
            attributes = {}
        public = [(f".{k}", v) for k, v in attributes.items() if not k.startswith("_")]
        out += public[:MAX_MEMBERS]
    return named_by_integration, out


def walk(variables: Iterable[tuple[str, object]]) -> Iterator[Found]:
    """Every object reachable from ``variables`` (name, value), breadth first, each once."""
    seen: set[int] = set()
    queue: deque[tuple[str, object, tuple[object, str] | None, int]] = deque(
        (name, value, None, 0) for name, value in variables
    )
    while queue:
        path, held, owner, depth = queue.popleft()
        value = inner(held)
        if value is None or id(value) in seen:
            continue
        seen.update((id(value), id(held)))
        yield Found(path, value, held, *(owner or (None, "")))
        if depth < MAX_DEPTH:
            by_integration, plain = _members(held)
            queue.extend(
                (path + suffix, v, (held, path), depth + 1) for suffix, v in by_integration
            )
            queue.extend((path + suffix, v, owner, depth + 1) for suffix, v in plain)


def follow(start: Found, rest: str) -> Found | None:
    """The object at ``start.path + rest``, stepping through the members the walk looks
    at: the walk names each object once (by its shortest path), so ``learner.model`` is
    reached here when ``model`` names the same module."""
    here = start
    while rest:
        by_integration, plain = _members(here.held)
        steps = [(s, v, True) for s, v in by_integration] + [(s, v, False) for s, v in plain]
        fits = [
            (s, v, r)
            for s, v, r in steps
            if rest.startswith(s) and (len(rest) == len(s) or rest[len(s)] in ".[")
        ]
        if not fits:
            return None
        suffix, held, by_its_integration = max(fits, key=lambda fit: len(fit[0]))
        value = inner(held)
        if value is None:
            return None
        owner = (here.held, here.path) if by_its_integration else (here.owner, here.owner_path)
        here = Found(here.path + suffix, value, held, *owner)
        rest = rest[len(suffix) :]
    return here


def rebuilt_by(found: Found) -> str | None:
    """Why the object ``found`` is about to be replaced by a new one (a Lightning trainer
    builds its optimizers again at every fit), else None."""
    known = None if found.owner is None else integration_of(found.owner)
    rebuilds = getattr(known, "rebuilds", None)
    if rebuilds is None or not rebuilds(found.owner):
        return None
    return known.REBUILT  # type: ignore[union-attr]


def optimizers_to_come(items: Iterable[tuple[str, object]], model: nn.Module) -> list[str]:
    """What the user's objects that build an optimizer for ``model`` later (a
    transformers Trainer before its first ``train()``) will build, each by its name."""
    found = []
    for name, value in items:
        known = integration_of(value)
        plan = getattr(known, "optimizer_to_come", None)
        text = plan(value, model) if plan is not None else None
        if text is not None:
            found.append(f"`{name}` {text}")
    return found


def untended_holder(found: Iterable[Found], model: nn.Module) -> str | None:
    """Why a command cannot keep in step an optimizer that holds ``model``'s parameters
    but is not a torch one (fastai's own ``learn.opt``), naming it; else None."""
    ids = {id(p) for p in model.parameters()}
    for f in found:
        known = integration_of(f.value)
        holds = getattr(known, "holds", None)
        if holds is not None and holds(f.value, ids):
            return f"`{f.path}` {known.UNTENDED}"  # type: ignore[union-attr]
    return None


def resume_notes(found: Iterable[Found], optimizer: torch.optim.Optimizer) -> list[str]:
    """What the library objects holding ``optimizer`` (a transformers Trainer) can no
    longer resume now that its groups changed, each in one line."""
    notes = []
    for f in found:
        known = integration_of(f.value)
        fails = getattr(known, "resume_fails", None)
        held = getattr(f.value, "optimizer", None)
        if fails is not None and held is not None and inner(held) is optimizer:
            text = fails(f.path, f.value, len(optimizer.param_groups))
            if text is not None:
                notes.append(text)
    return notes


def ways_to_build(items: Iterable[tuple[str, object]], model: nn.Module) -> list[str]:
    """How to get now the groups that the user's objects would build for ``model``
    later (``trainer.create_optimizer()``), each by its name."""
    ways = []
    for name, value in items:
        known = integration_of(value)
        plan = getattr(known, "optimizer_to_come", None)
        build = getattr(known, "build_now", None)
        if build is not None and plan is not None and plan(value, model) is not None:
            ways.append(build(name))
    return ways


def lr_setter(found: Iterable[Found], optimizer: torch.optim.Optimizer) -> str | None:
    """The object that overwrites ``optimizer``'s group lrs on its own (a fastai Learner
    at every fit), named with why; else None."""
    for f in found:
        known = integration_of(f.value)
        sets = getattr(known, "sets_lrs", None)
        why = sets(f.value, optimizer) if sets is not None else None
        if why is not None:
            return f"`{f.path}` ({type(f.value).__name__}) {why}"
    return None


@dataclass(frozen=True)
class Holder:
    """An object reached from the namespace that may change the model's trainability or
    its optimizer's groups on its own: ``refuses`` when a new param group would silently
    lose its lr to it."""

    path: str
    kind: str  # "ignite CosineAnnealingScheduler"
    does: str
    refuses: bool = False

    @property
    def line(self) -> str:
        return f"`{self.path}` ({self.kind}) {self.does}"


def _kind(obj: object) -> str:
    package = package_of(obj)
    name = type(obj).__name__
    return name if package in ("__main__", "builtins", "types") else f"{package} {name}"


def _held(
    obj: object, model: nn.Module, model_name: str, optimizer: object, optimizer_name: str | None
) -> list[str]:
    """Which of the model and its optimizer ``obj``'s own members hold, by name."""
    _, plain = _members(obj)
    out = []
    if any(isinstance(v, nn.Module) and unwrap(v) is model for _, v in plain):
        out.append(f"`{model_name}`")
    if optimizer is not None and any(same(v, optimizer) for _, v in plain):
        out.append(f"`{optimizer_name}`")
    return out


def holders(
    found: Iterable[Found],
    model: nn.Module,
    model_name: str,
    optimizer: object,
    optimizer_name: str | None,
) -> list[Holder]:
    """Objects that may set the lrs or trainability of ``model`` and ``optimizer`` on
    their own: what an integration knows to do so (an ignite ParamScheduler, a fine-tuning
    callback, a skorch net), and any object no integration knows whose attributes hold the model
    or the optimizer (a user's callback)."""
    out: list[Holder] = []
    for f in found:
        known = integration_of(f.held)
        if known is not None:
            own = getattr(known, "sets_on_its_own", None)
            for suffix, obj, does, refuses in own(f.held, model, optimizer) if own else []:
                out.append(Holder(f.path + suffix, _kind(obj), does, refuses))
            continue
        if isinstance(f.held, (list, tuple, dict)) or package_of(f.held) == "torchmagic":
            continue
        held = _held(f.held, model, model_name, optimizer, optimizer_name)
        if held:
            verb = "may change it" if held == [f"`{model_name}`"] else "may set its lrs"
            out.append(Holder(f.path, _kind(f.held), f"holds {' and '.join(held)} and {verb}"))
    return out
