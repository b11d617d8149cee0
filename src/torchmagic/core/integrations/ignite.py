"""pytorch-ignite: handlers live in an ``Engine``'s event lists, where no attribute walk
sees them (a handler attached with an event filter, ``Events.ITERATION_STARTED(every=2)``,
is kept as ignite's wrapper function, its ``__wrapped__`` the handler). ``LRScheduler``
wraps a torch scheduler (kept in step through it); any other ``ParamScheduler`` sets a
hyper-parameter of its optimizer's groups at each event, every group alike unless
``param_group_index`` names one, so a new group's lr is overwritten."""

from __future__ import annotations

from torch import nn

from ..surgery import scheduler_sync
from .classes import named
from .lookup import same

WRAPS = {"LRScheduler": "lr_scheduler"}


def members(obj: object) -> list[tuple[str, object]]:
    """The handlers attached to an ``Engine``, by the path that reaches them."""
    if not named(obj, "Engine"):
        return []
    out: list[tuple[str, object]] = []
    for event, handlers in dict(getattr(obj, "_event_handlers", None) or {}).items():
        label = f"Events.{getattr(event, 'name', event)}"
        for i, entry in enumerate(handlers):
            path, handler = f"._event_handlers[{label}][{i}][0]", entry[0]
            if hasattr(handler, "__wrapped__"):  # attached with an event filter
                path, handler = f"{path}.__wrapped__", handler.__wrapped__
            out.append((path, handler))
    return out


def sets_on_its_own(
    obj: object, model: nn.Module, optimizer: object
) -> list[tuple[str, object, str, bool]]:
    """A ``ParamScheduler`` of ``optimizer`` that sets every group's lr: (path suffix,
    the object, what it does, whether a new param group must be refused)."""
    if optimizer is None or not named(obj, "ParamScheduler"):
        return []
    if named(obj, "LRScheduler") and scheduler_sync.is_scheduler(obj.lr_scheduler):  # type: ignore[attr-defined]
        return []  # seen through: its torch scheduler is kept in step
    if not same(getattr(obj, "optimizer", None), optimizer):
        return []
    if getattr(obj, "param_name", None) != "lr" or obj.param_group_index is not None:  # type: ignore[attr-defined]
        return []
    does = "sets the lr of every param group at each event it is attached to"
    return [("", obj, does, True)]
