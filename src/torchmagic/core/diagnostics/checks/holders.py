"""Objects that set lrs or trainability on their own: an ignite ParamScheduler that would
overwrite a new group's lr, fine-tuning callbacks and skorch nets that redo the model's
trainability or its optimizer at the next fit, objects no integration knows that hold the model
or its optimizer, and another session that holds a model's undo history."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from ...integrations import discovery
from ...surgery.history import history_of
from ..context import DoctorContext, ModelEntry
from ..findings import Finding
from ..registry import CheckGroup

checks = CheckGroup()


@checks.namespace
def holders(context: DoctorContext) -> Iterator[Finding]:
    """Each such object once, with the first model (and optimizer) it concerns."""
    found = context.ws.found()
    seen: set[str] = set()
    for model in context.models:
        pairs: Sequence[tuple[str | None, torch.optim.Optimizer | None]] = model.optimizers
        for opt_name, opt in pairs or [(None, None)]:
            for holder in discovery.holders(found, model.module, model.name, opt, opt_name):
                if holder.path in seen:
                    continue
                seen.add(holder.path)
                if holder.refuses:
                    yield Finding(
                        "holder",
                        "warning",
                        holder.path,
                        f"{holder.line} of {opt_name}: %unfreeze with lr=, %replace_head and "
                        "%lora refuse to add a param group while it is attached",
                        "recreate it after the surgery with param_group_index for each "
                        "group (ignite ParamGroupScheduler)",
                    )
                else:
                    yield Finding(
                        "holder",
                        "info",
                        holder.path,
                        holder.line,
                        "edit where it builds the model or optimizer, or check after its "
                        "next run that the change held",
                    )


@checks.each_model
def history_elsewhere(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """A model whose undo history another session holds while this one has commands of
    its own: this one's commands on it are refused (one model, one history; a blank
    session would take it, see ``core.session.shared``)."""
    mine = context.history
    if mine is None or mine.blank():
        return
    theirs = history_of(model.module)
    if theirs is not None and theirs is not mine:
        yield Finding(
            "history-elsewhere",
            "warning",
            model.name,
            f"its undo history is held by another torchmagic session, {theirs.owner}: this "
            "session's commands on it are refused",
            "run them from that session, or give this one a model of its own",
        )
