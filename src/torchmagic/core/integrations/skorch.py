"""skorch: a ``NeuralNet`` builds ``module_`` (from ``net.module`` when that is a class)
and ``optimizer_`` again at every ``fit()`` unless ``warm_start``; ``partial_fit()`` keeps
both. An edit of either lasts until the next ``fit()``."""

from __future__ import annotations

from torch import nn

from ..modules import unwrap
from .classes import named
from .lookup import same

WRAPS: dict[str, str] = {}


def members(obj: object) -> list[tuple[str, object]]:
    """``net.module_`` and ``net.optimizer_`` first: what users address once the net is
    initialised (``net.module`` may be the same module, under the name it was given)."""
    if not named(obj, "NeuralNet"):
        return []
    return [
        (f".{name}", value)
        for name in ("module_", "optimizer_")
        if (value := getattr(obj, name, None)) is not None
    ]


def sets_on_its_own(
    obj: object, model: nn.Module, optimizer: object
) -> list[tuple[str, object, str, bool]]:
    """What a net holding ``model`` or ``optimizer`` undoes at its next ``fit()``."""
    if not named(obj, "NeuralNet") or getattr(obj, "warm_start", False):
        return []
    module = getattr(obj, "module_", None)
    holds_model = isinstance(module, nn.Module) and unwrap(module) is model
    held = getattr(obj, "optimizer_", None)
    if not holds_model and not (optimizer is not None and same(held, optimizer)):
        return []
    if isinstance(getattr(obj, "module", None), nn.Module):
        does = (
            "builds optimizer_ again at its next fit(): the param groups and lrs set here "
            "are lost there (partial_fit() keeps them)"
        )
    else:
        does = (
            "builds module_ and optimizer_ again at its next fit() from its module class: "
            "this change is lost there (partial_fit() keeps it)"
        )
    return [("", obj, does, False)]
