"""fastai: a ``Learner`` builds ``learn.opt`` at its first ``fit`` (``create_opt``) from
``learn.splitter(learn.model)``, by default the parameters that train then, and keeps it
across fits. ``OptimWrapper`` wraps a torch optimizer (its ``param_lists`` and ``hypers``
read the torch groups, so editing the inner optimizer keeps the wrapper in step); fastai's
own ``Optimizer`` keeps its own ``param_lists``, ``hypers`` and ``state``, which torchmagic
does not edit: a command that would leave them behind is refused."""

from __future__ import annotations

from torch import nn

from ..modules import unwrap
from .classes import named
from .lookup import inner

# wrapper class → the documented attribute holding the torch optimizer it wraps
WRAPS = {"OptimWrapper": "opt"}

UNTENDED = (
    "is fastai's own Optimizer, whose param lists torchmagic cannot keep in step: set "
    "learn.opt = None first (fit builds it again over the parameters that train then; "
    "its state is lost), or build the Learner with "
    "opt_func=partial(OptimWrapper, opt=torch.optim.Adam)"
)


def members(obj: object) -> list[tuple[str, object]]:
    """Nothing beyond the public attributes: ``learn.opt`` and ``learn.model`` are plain."""
    return []


def _is_own_optimizer(obj: object) -> bool:
    return named(obj, "Optimizer") and not named(obj, "OptimWrapper")


def holds(obj: object, ids: set[int]) -> bool:
    """Whether ``obj`` is fastai's own Optimizer holding one of the parameters ``ids``."""
    if not _is_own_optimizer(obj):
        return False
    lists = getattr(obj, "param_lists", ())
    return any(id(p) in ids for group in lists for p in group)


def optimizer_to_come(obj: object, model: nn.Module) -> str | None:
    """What a Learner of ``model`` that has no optimizer yet builds at ``fit``."""
    held = getattr(obj, "model", None)
    if not named(obj, "Learner") or getattr(obj, "opt", True) is not None:
        return None
    if not isinstance(held, nn.Module) or unwrap(held) is not model:
        return None
    return (
        "has no optimizer yet: its next fit builds one (create_opt) over the parameters "
        "that train then"
    )


def sets_lrs(obj: object, optimizer: object) -> str | None:
    """Why a Learner holding ``optimizer`` overwrites the lr of every group: its ``fit``
    calls ``opt.set_hypers(lr=...)`` with one lr, or one per group; else None."""
    if not named(obj, "Learner") or getattr(obj, "opt", None) is None:
        return None
    if inner(obj.opt) is not optimizer:  # type: ignore[attr-defined]
        return None
    return (
        "sets every group's lr at each fit: unfreeze without lr= and give fit one lr per "
        "group, in group order (learn.fit(n, lr=[...]))"
    )


def out_of_step(name: str, obj: object) -> tuple[str, str] | None:
    """(what is wrong, the fix) when a Learner's own fastai Optimizer misses parameters
    of its model that train (a head replaced by hand after the first fit), else None."""
    opt, model = getattr(obj, "opt", None), getattr(obj, "model", None)
    if not named(obj, "Learner") or not _is_own_optimizer(opt) or not isinstance(model, nn.Module):
        return None
    held = {id(p) for group in opt.param_lists for p in group}  # type: ignore[union-attr]
    missed = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if not missed:
        return None
    return (
        f"{name}.opt does not hold {len(missed)} trainable parameter(s) of {name}.model "
        f"({', '.join(missed[:3])}): {name}.fit never updates them",
        f"set {name}.opt = None (the next fit builds it over the parameters that train), "
        "or build the Learner with opt_func=partial(OptimWrapper, opt=torch.optim.Adam)",
    )
