"""Finding the model, optimizer and schedulers a command means, in a namespace dict.

In a notebook the namespace is the kernel's ``user_ns``; a script's Session keeps its own.
Models are remembered by variable name, so re-running ``model = ...`` is picked up and a
stale object is never edited.
"""

from __future__ import annotations

import types
from collections.abc import Container, Iterator, MutableMapping, Sequence

import torch
from torch import nn

from .errors import TorchMagicError
from .modules import unwrap
from .surgery import scheduler_sync
from .surgery.grammar import Target


class Workspace:
    """Names → live objects, plus which model is current and which optimizer it uses."""

    def __init__(self, namespace: MutableMapping, hidden: Container[str] = ()) -> None:
        self.namespace = namespace
        self.hidden = hidden
        self.current: str | None = None
        self.optimizer_of: dict[str, str] = {}

    def items(self) -> Iterator[tuple[str, object]]:
        """The user's variables: not private (``_x``), not hidden by IPython (``In``…)."""
        for name, value in list(self.namespace.items()):
            if not name.startswith("_") and name not in self.hidden:
                yield name, value

    def module(self, name: str) -> nn.Module | None:
        value = self.namespace.get(name)
        if isinstance(value, nn.Module) and not name.startswith("_"):
            return value
        return None

    def models(self) -> dict[str, nn.Module]:
        """Modules bound to variables that are not part of another bound module."""
        bound = [(n, v) for n, v in self.items() if isinstance(v, nn.Module)]
        inner: set[int] = set()
        for _, value in bound:
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

    def resolve_model(self, name: str | None = None) -> tuple[str, nn.Module]:
        """The named model, else the current one, else the only one in the namespace."""
        if name is not None:
            module = self.module(name)
            if module is None:
                raise TorchMagicError(self._not_a_model(name))
            return name, module
        if self.current is not None and self.module(self.current) is not None:
            return self.current, self.namespace[self.current]
        models = self.models()
        if len(models) == 1:
            return next(iter(models.items()))
        if not models:
            raise TorchMagicError(
                "no model found: bind an nn.Module to a variable first, "
                "e.g. model = torchvision.models.resnet18(weights=None)"
            )
        names = ", ".join(sorted(models))
        first = min(models)
        raise TorchMagicError(
            f"which model? candidates: {names}; prefix the target with one ({first}.<path>) "
            f"or make one current with use('{first}')"
        )

    def _not_a_model(self, name: str) -> str:
        if name not in self.namespace:
            return f"no variable named '{name}'"
        return f"'{name}' is a {type(self.namespace[name]).__name__}, not an nn.Module"

    def split_root(self, targets: Sequence[Target]) -> tuple[str, nn.Module, list[Target]]:
        """Separate the model variable (if the targets name one) from relative paths."""
        roots: list[str] = []
        relative: list[Target] = []
        for target in targets:
            head = target.head
            if head is not None and self.module(head) is not None:
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
        if len(relative) > 1:  # `model "*.bn*"`: a bare model name only sets the root
            relative = [t for t in relative if not t.is_whole] or relative[:1]
        return name, model, relative

    def optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        return [(n, v) for n, v in self.items() if isinstance(v, torch.optim.Optimizer)]

    def resolve_optimizer(
        self, model_name: str, model: nn.Module, name: str | None = None
    ) -> tuple[str | None, torch.optim.Optimizer | None]:
        """The optimizer of ``model``: named, or the one whose params are the model's
        (by identity), or the one used with this model before (it may be empty now)."""
        if name is not None:
            value = self.namespace.get(name)
            if not isinstance(value, torch.optim.Optimizer):
                what = "no variable" if value is None else f"a {type(value).__name__}"
                raise TorchMagicError(
                    f"optimizer={name}: {what}, not a torch.optim.Optimizer", param="optimizer"
                )
            return name, value
        optimizers = self.optimizers()
        remembered = self.optimizer_of.get(model_name)
        if len(optimizers) == 1 and optimizers[0][0] == remembered:
            return optimizers[0]  # the usual case: skip the walk over the model
        ids = {id(p) for p in model.parameters()}
        owning = [
            (n, o)
            for n, o in optimizers
            if any(id(p) in ids for g in o.param_groups for p in g["params"])
        ]
        if len(owning) > 1:
            for n, o in owning:
                if n == remembered:
                    return n, o
            names = ", ".join(n for n, _ in owning)
            raise TorchMagicError(
                f"several optimizers hold '{model_name}': {names}; name one with optimizer=NAME",
                param="optimizer",
            )
        if owning:
            return owning[0]
        if remembered is not None and isinstance(
            value := self.namespace.get(remembered), torch.optim.Optimizer
        ):
            return remembered, value
        return None, None

    def schedulers(self, optimizer: torch.optim.Optimizer) -> list:
        """Schedulers driving ``optimizer`` (torch's and timm's, with the children of
        Sequential/Chained ones), and objects that look like schedulers of it: bound to
        variables, inside lists, tuples and dicts bound to variables, or attributes of
        objects bound to variables (``trainer.scheduler``)."""
        found: list[object] = []
        for _, value in self.items():
            found.extend(_scheduler_candidates(value))
        return scheduler_sync.bound_to(found, optimizer)


# Never searched for schedulers among their attributes: models, tensors, imported modules.
_OPAQUE = (nn.Module, torch.Tensor, torch.optim.Optimizer, type, types.ModuleType)


def _scheduler_candidates(value: object) -> list:
    """``value``, the members of a list / tuple / dict, or the attributes of an object."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, _OPAQUE) or scheduler_sync.is_scheduler(value):
        return [value]
    try:
        attributes = list(vars(value).values())
    except TypeError:  # no __dict__
        attributes = []
    return [value, *attributes]
