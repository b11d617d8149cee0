"""Devices: tensors a step needs that are not where the model is, and models trained
away from the session's device."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ...advice import Call
from ...devices.placement import find_misplaced, odd_part, reference_device
from ..context import DoctorContext, ModelEntry
from ..findings import Finding, first_names
from ..registry import CheckGroup

checks = CheckGroup()


@checks.each_model
def off_session_device(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """A trained model on another device than the session's."""
    device, name = context.device, model.name
    if not model.optimizers or device is None:
        return
    where = reference_device(model.module)
    if where is not None and where != device:
        yield Finding(
            "device",
            "warning",
            name,
            f"{name} is on {where} but the session device is {device}",
            (
                Call("move", (name,)),
                f" moves {name}, its optimizer state and GradScaler together (or "
                f"{name}.to('{device}'))",
            ),
        )


@checks.each_model
def part_moved_by_hand(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """A part of the model cast to another dtype, or moved to the meta device (it holds no
    weights then), by hand: the next forward fails (``fit`` refuses it). Other devices are
    the ``device`` finding's."""
    odd = odd_part(model.module, model.name)
    if odd is None or (odd.kind == "device" and odd.found != "meta"):
        return
    yield Finding(
        "part-moved-by-hand",
        "error",
        odd.part,
        odd.what(model.name),
        odd.fix,
    )


@checks.each_model
def misplaced(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """Parameters, buffers, optimizer state or GradScaler tensors on another device than
    the model's, grouped by kind and device."""
    name = model.name
    # Each optimizer with each active scaler; the model alone when nothing trains it.
    optimizers: list[tuple[str | None, torch.optim.Optimizer | None]] = [*model.optimizers]
    scalers: list[torch.amp.GradScaler | None] = [*context.scalers]
    if not optimizers:
        optimizers, scalers = [(None, None)], [None]
    found: dict = {}
    for opt_name, opt in optimizers:
        for scaler in scalers or [None]:
            report = find_misplaced(
                model.module, opt, scaler, model_name=name, optimizer_name=opt_name or "optimizer"
            )
            found.update(dict.fromkeys(report.misplaced))
            reference = report.reference
    groups: dict[tuple, list] = {}
    for m in found:
        key = (m.kind, m.device, m.name if m.kind == "attribute" else "")
        groups.setdefault(key, []).append(m)
    for (kind, device, _), items in groups.items():
        yield Finding(
            "device",
            "error",
            f"{name}: {first_names([m.name for m in items])}",
            f"{len(items)} {kind} tensor(s) on {device}, the model is on {reference}",
            items[0].advice,
            sum(m.nbytes for m in items),
        )
