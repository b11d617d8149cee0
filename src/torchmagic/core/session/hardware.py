"""The Session's devices and memory: which device a command means (the session's, else the
model's), moves that take the optimizer state and the GradScaler along, and the memory
reports, timings and estimates of the (current) model under the session's AMP policy."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..advice import Call
from ..devices import placement
from ..devices.batch_size import BatchSizeReport, check_effective_batch, find_batch_size
from ..devices.compare import CompareReport, compare
from ..devices.device import MoveReport, resolve_device
from ..devices.device import move as move_model
from ..devices.estimate import Estimate
from ..devices.estimate import estimate as estimate_step
from ..devices.memory import MemoryReport, breakdown
from ..devices.pinbench import PinReport
from ..devices.pinbench import pinbench as time_host_copies
from ..devices.placement import CheckReport, find_misplaced
from ..errors import TorchMagicError
from ..modules import unwrap
from ..training.fit_plan import resolve_loss
from . import names

if TYPE_CHECKING:
    from .facade import Session


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters live (the CPU for a model without any)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def check_placement(session: Session, name: str, model: nn.Module) -> torch.device:
    """Where ``model`` runs a command: its device, refused in one line when that is not
    the session's device or not the one the AMP policy is on, or when a part of it is
    on another device or in another dtype than the rest."""
    odd = placement.odd_part(model, name)
    if odd is not None:
        raise TorchMagicError(odd.line(name))
    device = model_device(model)
    if session.device is not None and session.device != device:
        raise TorchMagicError(
            f"'{name}' is on {device} but the session device is {session.device}; "
            "move it there first"
        )
    amp = session.amp
    if amp.enabled and amp.device_type != device.type:
        raise TorchMagicError(
            f"AMP is on for {amp.device_type} but '{name}' is on {device.type}; "
            f"turn AMP on again for {device.type}"
        )
    return device


def device_type(session: Session, model: str | None) -> str:
    if session.device is not None:
        return session.device.type
    if model is None and not session.workspace.models():
        return resolve_device("auto").type
    _, module = session.workspace.resolve_model(model)
    return session.model_device(unwrap(module)).type


# A device as %device / set_device takes it: ``move cuda`` means a device, not a model.
_DEVICE_WORD = re.compile(r"(auto|cpu|cuda|mps)(:\d+)?", re.IGNORECASE)


def move(session: Session, model: str | None) -> MoveReport:
    if model is not None and model not in session.workspace.namespace:
        if _DEVICE_WORD.fullmatch(model):
            raise TorchMagicError(
                (
                    f"'{model}' is a device, not a model: ",
                    Call("set_device", (model,)),
                    " chooses it, then ",
                    Call("move"),
                    " moves the model there",
                ),
                param="model",
            )
    bound = session.bound(model)
    target = session.device or resolve_device("auto")
    report = move_model(
        bound.model, target, bound.optimizer, session.amp.scaler, model_name=bound.model_name
    )
    session.device = target
    return report


def check(session: Session, model: str | None) -> CheckReport:
    bound = session.bound(model, reading=True)
    return find_misplaced(
        bound.model,
        bound.optimizer,
        session.amp.scaler,
        model_name=bound.model_name,
        optimizer_name=bound.optimizer_name or "optimizer",
    )


def pinbench(session: Session, loader: object) -> PinReport:
    batches = names.variable(session.workspace, loader, "loader")
    session.last_pinbench = time_host_copies(batches, session.device)
    return session.last_pinbench


def compare_devices(
    session: Session,
    loader: object,
    model: str | None,
    optimizer: str | None,
    loss: str | Callable,
    steps: int,
) -> CompareReport:
    bound = session.bound(model, optimizer)
    return compare(
        bound.model,
        names.loader(session.workspace, loader, "loader"),
        bound.optimizer,
        loss_fn=resolve_loss(loss, session.workspace.namespace),
        steps=steps,
        model_name=bound.model_name,
    )


def batch_size(
    session: Session,
    input_shape: Sequence[int],
    *,
    model: str | None,
    optimizer: str | None,
    budget: int | None,
    max_batch: int | None,
    effective_batch: int | None,
) -> BatchSizeReport:
    effective_batch = check_effective_batch(effective_batch)
    bound = session.bound(model, optimizer)
    report = find_batch_size(
        bound.model,
        bound.optimizer,
        tuple(input_shape),
        budget=budget,
        max_batch=max_batch,
        amp_dtype=_amp_dtype(session),
    )
    return replace(report, effective_batch=effective_batch)


def memory(session: Session, model: str | None) -> MemoryReport:
    namespace = session.workspace.namespace
    try:
        bound = session.bound(model, reading=True)
    except TorchMagicError:
        if model is not None:
            raise
        report = breakdown(None, namespace=namespace)
    else:
        report = breakdown(
            bound.model, bound.optimizer, model_name=bound.model_name, namespace=namespace
        )
    return replace(report, history_bytes=session.history_bytes("cpu"))


def estimate(
    session: Session,
    model: str | None,
    optimizer_class: str | type[torch.optim.Optimizer] | None,
    input_shape: Sequence[int] | None,
) -> Estimate:
    bound = session.bound(model)
    return estimate_step(
        bound.model,
        optimizer_class or bound.optimizer,
        None if input_shape is None else tuple(input_shape),
        model_name=bound.model_name,
        amp_dtype=_amp_dtype(session),
    )


def _amp_dtype(session: Session) -> torch.dtype | None:
    """The autocast dtype a training step runs in under the session's policy."""
    return session.amp.dtype if session.amp.enabled else None
