"""What one fit run is given (``FitPlan``), the losses it can take by name, and the
checks that refuse a plan that cannot train before anything changes."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from ..errors import TorchMagicError
from .amp import AmpController, check_accumulate, check_clip
from .counts import check_ceiling
from .data import load_batch, split_batch
from .fit_events import FitObserver, SilentObserver
from .progressive import Pacing, check_pacing
from .schedule_steps import SCHED_STEPS, SchedStep

LOSSES: dict[str, Callable] = {
    "cross_entropy": F.cross_entropy,
    "nll": F.nll_loss,
    "bce": F.binary_cross_entropy_with_logits,
    "mse": F.mse_loss,
    "l1": F.l1_loss,
    "smooth_l1": F.smooth_l1_loss,
    "huber": F.huber_loss,
}
# Callables that live in a namespace without the user defining them (``exit``,
# ``get_ipython``, ``print``…): never taken for a loss.
_NOT_USER_MODULES = ("builtins", "_sitebuiltins", "site", "IPython", "ipykernel")
_EMPTY = object()  # a loader or list with no batch at all


@dataclass
class FitPlan:
    """Everything one run needs, resolved by the session and checked by ``fit``."""

    model: nn.Module
    model_name: str
    optimizer: torch.optim.Optimizer
    schedulers: list
    loss_fn: Callable
    device: torch.device
    amp: AmpController
    train: Iterable
    val: Iterable | None = None
    epochs: int = 1
    max_steps: int | None = None
    cache_features: bool = False
    sched_step: SchedStep | None = None
    label: str = ""
    observer: FitObserver = field(default_factory=SilentObserver)
    pacing: Pacing | None = None
    accumulate: int = 1  # loader batches per optimizer step
    clip: float | None = None  # clip the total gradient norm to this before each step
    # (name, build over a count of classes): torchmetrics metrics measured on ``val``
    metrics: tuple[tuple[str, Callable[[int], Any]], ...] = ()


def _user_defined(value: object) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module.partition(".")[0] not in _NOT_USER_MODULES


def resolve_loss(name: str | Callable, namespace: Mapping[str, object]) -> Callable:
    """A loss by name (``cross_entropy``, ``mse``…), a callable the user bound to a
    variable (a function, ``nn.CrossEntropyLoss()``…), or, from Python, that callable."""
    if not isinstance(name, str):
        if isinstance(name, type) or not callable(name):
            raise TorchMagicError(
                f"loss must be a name or a loss function, got the {type(name).__name__} "
                f"{name!r}" + (" (a class: pass an instance)" if isinstance(name, type) else ""),
                param="loss",
            )
        return name
    if name in LOSSES:
        return LOSSES[name]
    value = None if name.startswith("_") else namespace.get(name)
    if isinstance(value, type):
        raise TorchMagicError(
            f"loss '{name}' is a class: bind an instance, e.g. criterion = {name}()",
            param="loss",
        )
    if callable(value) and _user_defined(value):
        return value
    word = name.lower().removesuffix("loss").rstrip("_") or name.lower()  # CrossEntropyLoss
    close = difflib.get_close_matches(word, list(LOSSES), n=2)
    names = " or ".join(close) if close else f"one of {', '.join(LOSSES)}"
    hint = f"did you mean {names}?" if close else f"use {names}"
    raise TorchMagicError(
        f"unknown loss '{name}'; {hint} (or the name of a loss function you defined)",
        param="loss",
    )


# -- checks before any step --------------------------------------------------------------


def _first_batch(data: Iterable) -> object | None:
    """The first batch when it can be read without iterating (a list, or a loader over
    a map-style dataset: its first sample, collated); None when it cannot."""
    if isinstance(data, DataLoader):
        dataset = data.dataset
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            return None
        return load_batch(data, [0]) if len(dataset) else _EMPTY
    if isinstance(data, Sequence):
        return data[0] if len(data) else _EMPTY
    return None


def input_shape(data: Iterable) -> tuple[int, ...] | None:
    """The shape of the inputs of ``data``'s first batch, when it can be read without
    iterating (see ``_first_batch``) and the inputs are one tensor; else None."""
    first = _first_batch(data)
    if first is None or first is _EMPTY:
        return None
    inputs, _ = split_batch(first, "data")
    return tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else None


def _check_batches(data: object, param: str) -> None:
    if isinstance(data, (torch.Tensor, str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise TorchMagicError(
            f"{param} must be a DataLoader or another iterable of (inputs, targets) batches, "
            f"not a {type(data).__name__}",
            param=param,
        )
    first = _first_batch(data)
    if first is _EMPTY:
        raise TorchMagicError(f"{param} has no batches", param=param)
    if first is not None:
        split_batch(first, param)


def check_plan(plan: FitPlan) -> None:
    """Refuse a plan that cannot train, before anything changes."""
    if plan.epochs < 1:
        raise TorchMagicError(f"epochs must be at least 1, got {plan.epochs}", param="epochs")
    if plan.max_steps is not None and plan.max_steps < 1:
        raise TorchMagicError(
            f"max_steps must be at least 1, got {plan.max_steps}", param="max_steps"
        )
    if plan.sched_step is not None and plan.sched_step not in SCHED_STEPS:
        raise TorchMagicError(
            f"sched_step must be 'batch', 'epoch' or None, got {plan.sched_step!r}",
            param="sched_step",
        )
    for param in ("epochs", "max_steps"):
        check_ceiling(getattr(plan, param), param)
    if plan.pacing is not None:
        check_ceiling(plan.pacing.every, "every")
        check_ceiling(plan.pacing.patience, "patience")
    check_accumulate(plan.accumulate)
    check_clip(plan.clip)
    _check_batches(plan.train, "train")
    if plan.val is not None:
        _check_batches(plan.val, "val")
    if plan.pacing is not None:
        measured = tuple(name for name, _ in plan.metrics)
        check_pacing(plan.pacing, plan.val is not None, plan.cache_features, measured)
    if not any(p.requires_grad for p in plan.model.parameters()):
        raise TorchMagicError(
            f"nothing to train: every parameter of `{plan.model_name}` is frozen "
            "(unfreeze a block first)",
            param="model",
        )
