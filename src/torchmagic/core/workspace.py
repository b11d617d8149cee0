"""Finding the model, optimizer and schedulers a command means, in a namespace dict.

In a notebook the namespace is the kernel's ``user_ns``; a script's Session keeps its own.
Objects are found by :mod:`.integrations.discovery` (variables, and two attribute levels
inside them: ``learner.opt``, ``trainer.optimizers[0]``, wrappers seen through) and named
by that path. Models are remembered by path, so re-running ``model = ...`` is picked up
and a stale object is never edited.
"""

from __future__ import annotations

import difflib
import weakref
from collections.abc import Callable, Container, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeGuard

import torch
from torch import nn

from .advice import Call, Option
from .ema_owners import EmaOwners
from .errors import TorchMagicError
from .integrations import discovery, ema
from .integrations.discovery import Found
from .integrations.lookup import state_holder
from .modules import unwrap
from .surgery import optimizer_sync, scheduler_sync
from .surgery.grammar import Target, parse_segment
from .tensors import optimizer_params, owners


@dataclass
class _Walk:
    """One walk of the namespace: its variables and what is reachable from them (each
    filled at its first use)."""

    variables: list[tuple[str, object]] | None = None
    found: list[Found] | None = None


class StaleOptimizerError(TorchMagicError):
    """An optimizer holding none of a model's parameters was about to be used for it."""


class Workspace:
    """Names → live objects, plus which model is current and which optimizer it uses."""

    def __init__(self, namespace: MutableMapping, hidden: Container[str] = ()) -> None:
        self.namespace = namespace
        self.hidden = hidden
        self.current: str | None = None
        self.optimizer_of: dict[str, str] = {}
        # the model object each ``optimizer_of`` entry was made for: a rebound variable
        # (the model cell re-run) must not inherit the old model's optimizer
        self._remembered_for: dict[str, weakref.ref] = {}
        # the optimizer object each ``optimizer_of`` entry named: one holding other models'
        # parameters too (``backbone`` and ``head`` apart) stays the model's once a freeze
        # has taken all of the model's out of it, until the name is bound to another
        self._used_optimizer: dict[str, weakref.ref] = {}
        self._pinned: _Walk | None = None  # the namespace's walk, while a command runs
        self.ema_owners = EmaOwners()  # whose each EMA copy is, decided at first sight

    def items(self) -> Iterator[tuple[str, object]]:
        """The user's variables: not private (``_x``), not hidden by IPython (``In``…)."""
        pinned = self._pinned
        if pinned is None:
            return self._variables()
        if pinned.variables is None:
            pinned.variables = list(self._variables())
        return iter(pinned.variables)

    def _variables(self) -> Iterator[tuple[str, object]]:
        for name, value in list(self.namespace.items()):
            if not name.startswith("_") and name not in self.hidden:
                yield name, value

    def found(self) -> list[Found]:
        """Every object reachable from the user's variables (see :mod:`.discovery`)."""
        pinned = self._pinned
        if pinned is None:
            return list(discovery.walk(self.items()))
        if pinned.found is None:
            pinned.found = list(discovery.walk(self.items()))
        return pinned.found

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Within the block the namespace is walked once, at the first look, and that walk
        serves every lookup: a command that binds no variable cannot see the namespace
        change under it (re-entrant)."""
        if self._pinned is not None:
            yield
            return
        self._pinned = _Walk()
        try:
            yield
        finally:
            self._pinned = None

    def lookup(self, path: str) -> Found | None:
        """The object at ``path`` as the walk names it (``model``, ``learner.opt``,
        ``trainer.optimizers[0]``); no text is ever evaluated."""
        if "." not in path and "[" not in path:
            if path.startswith("_") or path in self.hidden or path not in self.namespace:
                return None
            value = self.namespace[path]
            return Found(path, discovery.inner(value), value)
        found = self.found()
        exact = next((f for f in found if f.path == path), None)
        if exact is not None:
            return exact
        # an alias: the walk named the object by another path (``model`` for
        # ``learner.model``); follow the path from the longest prefix it did name
        prefixes = [f for f in found if path[len(f.path) : len(f.path) + 1] in (".", "[")]
        prefixes = [f for f in prefixes if path.startswith(f.path)]
        head = path.split(".", 1)[0].split("[", 1)[0]
        if not prefixes and (root := self.lookup(head)) is not None:
            prefixes = [root]  # a second name for an object the walk named first
        start = max(prefixes, key=lambda f: len(f.path), default=None)
        return None if start is None else discovery.follow(start, path[len(start.path) :])

    def module(self, name: str) -> nn.Module | None:
        found = self.lookup(name)
        return found.held if found is not None and isinstance(found.held, nn.Module) else None

    def models(self) -> dict[str, nn.Module]:
        """Modules with parameters bound to variables or attributes (``learner.model``)
        that are not part of another such module (a loss function or a transform is never
        a model), nor an EMA copy of one (it is named, never picked)."""
        found = self.found()
        copies = {id(m) for f in found if (m := ema.averaged(f.held)) is not None}
        bound = [
            (f.path, f.held)
            for f in found
            if not f.in_container
            and _has_parameters(f.held)
            and ema.averaged(f.held) is None
            and id(f.held) not in copies
        ]
        inner: set[int] = set()
        for _, value in bound if len(bound) > 1 else ():  # one alone is inside no other
            real = unwrap(value)
            inner.update(id(m) for m in real.modules() if m is not real)
        by_real: dict[int, tuple[str, nn.Module]] = {}
        for name, value in bound:
            real = unwrap(value)
            if id(real) in inner:
                continue
            # prefer the variable bound to the model itself over one bound to its wrapper
            if id(real) not in by_real or value is real:
                by_real[id(real)] = (name, value)
        return dict(by_real.values())

    def ema_helpers(self) -> list[tuple[str, nn.Module]]:
        """Every EMA helper the walk reaches: (path, its averaged copy)."""
        return [(f.path, copy) for f in self.found() if (copy := ema.averaged(f.held)) is not None]

    def ema_copies(self, model: nn.Module) -> tuple[list[tuple[str, nn.Module]], str | None]:
        """EMA helpers keeping an average of ``model`` (path, averaged copy): those shaped
        like it that belong to it, and why one shaped like it is unplaced (see
        :mod:`.ema_owners`)."""
        helpers = self.ema_helpers()
        if not helpers:
            return [], None
        return self.ema_owners.copies_of(model, helpers, self.models())

    def resolve_model(self, name: str | None = None) -> tuple[str, nn.Module]:
        """The named model, else the current one, else the only one in the namespace."""
        if name is not None:
            module = self.module(name)
            if module is None:
                raise TorchMagicError(self._not_a_model(name))
            return name, module
        if self.current is not None and self.module(self.current) is not None:
            return self.current, self.module(self.current)  # type: ignore[return-value]
        models = self.models()
        if len(models) == 1:
            return next(iter(models.items()))
        if not models:
            raise TorchMagicError(
                "no model found: bind an nn.Module to a variable first, "
                f"e.g. model = torchvision.models.resnet18(weights=None){self._in_containers()}"
            )
        names = ", ".join(sorted(models))
        first = min(models)
        raise TorchMagicError(
            (
                f"which model? candidates: {names}; prefix the target with one ({first}.<path>) "
                "or make one current with ",
                Call("use", (first,)),
            )
        )

    def _in_containers(self) -> str:
        """The hint for a model only a list or dict holds: the walk does not pick those."""
        held = next(
            (f.path for f in self.found() if f.in_container and _has_parameters(f.held)), None
        )
        if held is None:
            return ""
        return f" (models inside containers are not searched; bind it: m = {held})"

    def _not_a_model(self, name: str) -> str:
        found = self.lookup(name)
        if found is None:
            return f"no variable named '{name}'" if "." not in name else f"nothing at '{name}'"
        return f"'{name}' is a {type(found.held).__name__}, not an nn.Module"

    def owner_of(self, name: str) -> tuple[str, str] | None:
        """(model variable, qualified path) when the variable ``name`` is bound to a
        module inside a bound model (``layer4 = model.layer4``), else None."""
        value = self.module(name)
        if value is None:
            return None
        value = unwrap(value)
        models = self.models()
        if name in models:
            return None
        found: dict[str, str] = {}
        for model_name, model in models.items():
            for path, module in unwrap(model).named_modules(remove_duplicate=False):
                if module is value and path:
                    found.setdefault(model_name, path)
                    break
        if len(found) > 1 and self.current in found:
            return self.current, found[self.current]
        if len(found) > 1:
            where = ", ".join(f"{m}.{p}" for m, p in found.items())
            raise TorchMagicError(f"'{name}' is part of several models ({where}); name one")
        return next(iter(found.items()), None)

    def relative_to(self, root: str, target: Target) -> Target:
        """``target`` as a path inside the model ``root``: its head dropped when it names
        ``root``, replaced by its path when it names a sub-module of ``root``."""
        head = target.head
        if head is None:
            return target
        if head == root:
            return target.without_head()
        owner = self.owner_of(head)
        if owner is None or owner[0] != root:
            return target
        return _under(owner[1], target.without_head())

    def split_root(self, targets: Sequence[Target]) -> tuple[str, nn.Module, list[Target]]:
        """Separate the model variable (if the targets name one) from relative paths.
        A variable bound to a sub-module of a model names that model at its path."""
        roots: list[str] = []
        relative: list[Target] = []
        for target in targets:
            head = target.head
            owner = self.owner_of(head) if head is not None else None
            held = self._attribute_model(target)
            if held is not None:  # learner.model.layer1: the model lives in an attribute
                if held[0] not in roots:
                    roots.append(held[0])
                relative.append(held[1])
            elif owner is not None:
                if owner[0] not in roots:
                    roots.append(owner[0])
                relative.append(_under(owner[1], target.without_head()))
            elif head is not None and self.module(head) is not None:
                if head not in roots:
                    roots.append(head)
                relative.append(target.without_head())
            else:
                relative.append(target)
        if len(roots) > 1:
            raise TorchMagicError(f"one model per command, got {', '.join(roots)}")
        name, model = self.resolve_model(roots[0] if roots else None)
        for target in relative:
            head = target.head
            if head is not None and head in self.namespace and head not in unwrap(model)._modules:
                raise TorchMagicError(f"{self._not_a_model(head)} (in '{target.text}')")
            if head is not None and not roots and head not in unwrap(model)._modules:
                self._refuse_misspelt_variable(head, name, model)
        if len(relative) > 1:  # `model "*.bn*"`: a bare model name only sets the root
            relative = [t for t in relative if not t.is_whole] or relative[:1]
        return name, model, relative

    def _refuse_misspelt_variable(self, head: str, name: str, model: nn.Module) -> None:
        """``modle.layer1``: a first segment that is neither a variable nor a child of the
        current model, but close to a model variable, names that variable."""
        close = difflib.get_close_matches(head, list(self.models()), n=1, cutoff=0.75)
        if close and close[0] not in unwrap(model)._modules:
            raise TorchMagicError(
                f"no variable or module '{head}' ('{name}' has no child '{head}'); "
                f"did you mean the variable '{close[0]}'?"
            )

    def _attribute_model(self, target: Target) -> tuple[str, Target] | None:
        """(path, rest) when ``target`` starts with the path of a model held in an
        attribute of a variable (``learner.model`` in ``learner.model.layer1``)."""
        head = target.head
        if head is None or target.glob is not None or self.module(head) is not None:
            return None
        texts = [segment.text for segment in target.segments]
        for k in range(len(texts), 1, -1):
            path = ".".join(texts[:k])
            if self.module(path) is not None:
                return path, Target(text=target.text, segments=target.segments[k:])
        return None

    def optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        """Every optimizer reachable from the namespace, wrappers seen through, by path;
        the base optimizer that another steps and keeps its state in (timm's Lookahead's)
        is that one's part, not an optimizer of its own."""
        found = [
            (f.path, f.value) for f in self.found() if isinstance(f.value, torch.optim.Optimizer)
        ]
        bases = {id(b) for _, o in found if (b := state_holder(o)) is not o}
        return [(path, o) for path, o in found if id(o) not in bases]

    def scalers(self) -> list[torch.amp.GradScaler]:
        """Every GradScaler reachable from the namespace (``accelerator.scaler`` too)."""
        return [f.value for f in self.found() if isinstance(f.value, torch.amp.GradScaler)]

    def optimizer(self, path: str) -> torch.optim.Optimizer | None:
        """The optimizer at ``path`` (wrappers seen through), else None."""
        found = self.lookup(path)
        value = None if found is None else found.value
        return value if isinstance(value, torch.optim.Optimizer) else None

    def rebuilt(self, path: str) -> str | None:
        """Why the optimizer at ``path`` is about to be replaced by a new one (its owner
        builds it again: a Lightning trainer at every fit), else None."""
        found = self.lookup(path)
        if found is None or found.owner is None:
            return None
        why = discovery.rebuilt_by(found)
        return None if why is None else f"{found.owner_path} {why}"

    def remember(self, model_name: str, model: nn.Module, optimizer_name: str) -> None:
        """``optimizer_name`` is the optimizer of ``model`` (as bound to ``model_name``),
        also once a freeze has emptied it."""
        self.optimizer_of[model_name] = optimizer_name
        self._remembered_for[model_name] = weakref.ref(unwrap(model))
        optimizer = self.optimizer(optimizer_name)
        if optimizer is not None:
            self._used_optimizer[model_name] = weakref.ref(optimizer)
        else:
            self._used_optimizer.pop(model_name, None)

    def _still_used(self, model_name: str, model: nn.Module, optimizer: object) -> bool:
        """Whether ``optimizer`` is the very object the last command on this very model
        object used (neither the model nor the optimizer was re-created since)."""
        made_for = self._remembered_for.get(model_name)
        used = self._used_optimizer.get(model_name)
        return (
            made_for is not None
            and made_for() is unwrap(model)
            and used is not None
            and used() is optimizer
        )

    def resolve_optimizer(
        self,
        model_name: str,
        model: nn.Module,
        name: str | None = None,
        *,
        parameters: Sequence[nn.Parameter],
        acting_on: Callable[[], Sequence[nn.Parameter]] | None = None,
    ) -> tuple[str | None, torch.optim.Optimizer | None]:
        """The optimizer of ``model`` (whose ``parameters`` are given, each once): named,
        or the one whose params are the model's (by identity), or the one used with this
        model object before (it may be empty now).

        When several optimizers hold (or are the home of) the model's parameters, a
        command that says which parameters it is ``acting_on`` gets the one holding them
        (the one holding most of them, when they are spread: the command handles each
        parameter in its own, see ``BoundModel.others``).

        An optimizer that holds parameters but none of ``model``'s is refused, and so is the
        one remembered for a model object ``model_name`` no longer names (the model cell
        was re-run, not the optimizer cell): stepping it would train nothing ``model_name``
        holds, and adding ``model``'s parameters to it would mix two models in one optimizer.
        """
        ids = {id(p) for p in parameters}
        if name is not None:
            value = self.optimizer(name)
            if value is None:
                found = self.lookup(name)
                if found is None:
                    what = "no variable" if "." not in name else "nothing there"
                else:
                    what = f"a {type(found.held).__name__}"
                raise TorchMagicError(
                    f"optimizer={name}: {what}, not a torch.optim.Optimizer", param="optimizer"
                )
            if not _empty(value) and not _holds(value, ids):
                if not self._still_used(model_name, model, value) and not (
                    optimizer_sync.homed(value, parameters)
                ):
                    raise self._stale(name, value, model_name)
            return name, value
        optimizers = self.optimizers()
        remembered = self.optimizer_of.get(model_name)
        if acting_on is not None:
            holding = self.holding(parameters, optimizers)
            chosen = _most_of(holding, acting_on(), remembered) if len(holding) > 1 else None
            if chosen is not None:
                return chosen
        owning = owners(optimizers, parameters)
        if len(owning) > 1:  # one a command used before would leave the other's unstepped
            names = ", ".join(n for n, _ in owning)
            raise TorchMagicError(
                (
                    f"several optimizers hold '{model_name}': {names}; name one with ",
                    Option("optimizer", "NAME"),
                ),
                param="optimizer",
            )
        if owning:
            return owning[0]
        value = self.optimizer(remembered) if remembered is not None else None
        if remembered is not None and value is not None:
            made_for = self._remembered_for.get(model_name)
            rebound = made_for is not None and made_for() is not unwrap(model)
            if rebound or (not _empty(value) and not self._still_used(model_name, model, value)):
                raise self._stale(remembered, value, model_name)
            return remembered, value
        left = [(n, o) for n, o in optimizers if optimizer_sync.homed(o, parameters)]
        return left[0] if len(left) == 1 else (None, None)  # the one they all left

    def holding(
        self,
        parameters: Sequence[nn.Parameter],
        optimizers: Sequence[tuple[str, torch.optim.Optimizer]] | None = None,
    ) -> list[tuple[str, torch.optim.Optimizer]]:
        """The optimizers that hold one of ``parameters`` or are the home of one (it left
        them frozen), each once, in the namespace's order."""
        ids = {id(p) for p in parameters}
        out: list[tuple[str, torch.optim.Optimizer]] = []
        for name, opt in self.optimizers() if optimizers is None else optimizers:
            if any(o.param_groups is opt.param_groups for _, o in out):
                continue  # one optimizer stepping another over the same groups
            if _holds(opt, ids) or optimizer_sync.homed(opt, parameters):
                out.append((name, opt))
        return out

    def _stale(
        self, name: str, optimizer: torch.optim.Optimizer, model_name: str
    ) -> StaleOptimizerError:
        """The refusal to use ``optimizer`` for ``model_name``: which model it trains
        instead, and the fix."""
        held = {id(p) for p in optimizer_params(optimizer)}
        others = [
            n
            for n, m in self.models().items()
            if n != model_name and any(id(p) in held for p in unwrap(m).parameters())
        ]
        if others:
            why = f"it trains {', '.join(repr(n) for n in others)}"
        elif held:
            why = (
                f"it holds the parameters of a model no variable names any more: was "
                f"'{model_name}' re-created after '{name}'?"
            )
        else:
            why = f"it was made for the model '{model_name}' named before it was re-bound"
        kind = type(optimizer).__name__
        return StaleOptimizerError(
            (
                f"'{name}' holds none of the parameters of '{model_name}' ({why}); re-create "
                f"it ({name} = torch.optim.{kind}({model_name}.parameters(), lr=…)) or choose "
                "another with ",
                Option("optimizer", "NAME"),
            ),
            param="optimizer",
        )

    def stale_optimizers(self) -> list[str]:
        """Optimizers holding parameters of no bound model: left over from a model that
        was re-created or re-bound."""
        bound = {id(p) for m in self.models().values() for p in unwrap(m).parameters()}
        return [n for n, o in self.optimizers() if not _empty(o) and not _holds(o, bound)]

    def schedulers(self, optimizer: torch.optim.Optimizer) -> list:
        """Schedulers driving ``optimizer`` (torch's and timm's, with the children of
        Sequential/Chained ones; wrappers such as Accelerate's seen through), and objects
        that look like schedulers of it, wherever the walk finds them."""
        return scheduler_sync.bound_to([f.value for f in self.found()], optimizer)

    def names(self) -> dict[int, str]:
        """The path of every object the walk reaches, by identity (wrappers and what
        they wrap alike), to name schedulers in summaries."""
        out: dict[int, str] = {}
        for f in self.found():
            out.setdefault(id(f.value), f.path)
            out.setdefault(id(f.held), f.path)
        return out


def _has_parameters(value: object) -> TypeGuard[nn.Module]:
    return isinstance(value, nn.Module) and any(True for _ in unwrap(value).parameters())


def _empty(optimizer: torch.optim.Optimizer) -> bool:
    """Whether no group holds a parameter (a freeze of the whole model empties them)."""
    return not any(True for _ in optimizer_params(optimizer))


def _holds(optimizer: torch.optim.Optimizer, ids: Container[int]) -> bool:
    """Whether ``optimizer`` holds any parameter whose ``id`` is in ``ids``."""
    return any(id(p) in ids for p in optimizer_params(optimizer))


def _most_of(
    holding: Sequence[tuple[str, torch.optim.Optimizer]],
    params: Sequence[nn.Parameter],
    remembered: str | None,
) -> tuple[str, torch.optim.Optimizer] | None:
    """Of ``holding``, the one holding (or home of) most of ``params``: the remembered
    one on a tie; None when none holds any."""
    ids = {id(p) for p in params}
    frozen = [p for p in params if not p.requires_grad]

    def count(opt: torch.optim.Optimizer) -> int:
        return sum(1 for p in optimizer_params(opt) if id(p) in ids) + optimizer_sync.homed(
            opt, frozen
        )

    held, _, _, chosen = max(
        (count(opt), name == remembered, -rank, (name, opt))
        for rank, (name, opt) in enumerate(holding)
    )
    return chosen if held else None


def _under(path: str, target: Target) -> Target:
    """``target`` (relative to a sub-module) made relative to the model holding that
    sub-module at ``path``."""
    if target.glob is not None:
        return Target(text=target.text, glob=f"{path}.{target.glob}")
    prefix = tuple(parse_segment(part, target.text) for part in path.split("."))
    return Target(text=target.text, segments=prefix + target.segments)
