"""The one-line fine-tuning recipe, as the engine's own commands.

``Session.fine_tune`` is fastai's ``fine_tune``: freeze everything but the head, train
``freeze_epochs``, unfreeze every block with lrs spread geometrically from lr/100 (the
first block) to lr (the head), train ``epochs``. Each step is the session's own
``freeze`` / ``fit`` / ``unfreeze`` / ``fit`` call, so each is in the history and the
recipe equals those four commands typed by hand. The blocks are the model's top-level
children that hold parameters (descending through single wrappers such as a lone
``backbone``), in module order.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..surgery.results import Change
from .fit import FitHistory


def fine_tune_blocks(model: nn.Module) -> tuple[str, ...]:
    """The blocks the recipe unfreezes: the first level below ``model`` (or below a chain
    of lone children) at which the parameters split over several children."""
    prefix, module = "", model
    while True:
        holders = [(n, c) for n, c in module.named_children() if any(True for _ in c.parameters())]
        if len(holders) != 1 or any(True for _ in module.parameters(recurse=False)):
            break
        name, module = holders[0]
        prefix = f"{prefix}{name}."
    if not holders:  # a lone leaf holds everything (or nothing does)
        return (prefix.rstrip("."),) if prefix else ()
    return tuple(f"{prefix}{name}" for name, _ in holders)


@dataclass(frozen=True)
class FineTuneResult:
    """The recipe's four steps; the last two are None when the head's run stopped early
    (interrupted, or a non-finite loss): the recipe does not go on after that."""

    model_name: str
    lr: float  # the top of the spread: the head's lr in the second run
    blocks: tuple[str, ...]
    freeze: Change
    head_fit: FitHistory
    unfreeze: Change | None = None
    full_fit: FitHistory | None = None
