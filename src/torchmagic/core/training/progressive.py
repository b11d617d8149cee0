"""Progressive unfreezing and validation-driven stops for one fit run.

A run starts with what is trainable now and unfreezes the listed blocks one at a time:
every ``every`` epochs, or when the monitored validation metric has not improved for
``patience`` epochs. The monitored metric is the validation loss (lower is better),
``acc`` (the validation accuracy) or one of the run's named metrics (``f1``…, in the
direction torchmetrics gives it). The k-th block gets base lr = the base lr of the block before it
× ``lr_ratio`` (the first: the head group's base lr × ``lr_ratio``). The unfreeze itself
is the session's (a history entry, undoable, home groups, schedulers kept in step): this
module only decides *when* and *at which lr*, and calls it.

``early_stop`` ends the run once every block is unfrozen and the metric has not improved
for ``patience`` (else ``every``) more epochs. ``keep_best`` keeps one copy of the
model's ``state_dict`` on the host (its size in host memory), taken at each new best
epoch, and loads it back when the run ends on a worse epoch; optimizer state is not
rolled back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from ..errors import TorchMagicError
from ..options import FitOptions

if TYPE_CHECKING:
    from .fit_events import EpochMetrics

Monitor = str  # "loss", "acc", or the name of one of the run's metrics
BUILT_IN_MONITORS: tuple[Monitor, ...] = ("loss", "acc")


class Unfrozen(NamedTuple):
    """One unfreeze of a run: after ``epoch`` (1-based), so ``block`` trains from the
    next epoch on, at ``base_lr``."""

    epoch: int
    block: str
    base_lr: float


@dataclass(frozen=True)
class Pacing:
    """What the run unfreezes and when it stops, with the session's two hooks:
    ``unfreeze(block, base_lr, epoch)`` performs one unfreeze, ``head_base_lr()`` reads
    the head group's base lr at the moment of the first one."""

    blocks: tuple[str, ...] = ()
    every: int | None = None
    patience: int | None = None
    lr_ratio: float = FitOptions.lr_ratio
    monitor: Monitor = "loss"
    early_stop: bool = False
    keep_best: bool = False
    higher_is_better: bool | None = None  # None: lower for the loss, higher for the rest
    unfreeze: Callable[[str, float, int], None] | None = None
    head_base_lr: Callable[[], float] | None = None

    @property
    def needs_validation(self) -> bool:
        return self.patience is not None or self.early_stop or self.keep_best

    @property
    def rising(self) -> bool:
        """Whether a larger value of the monitored metric is better."""
        if self.higher_is_better is not None:
            return self.higher_is_better
        return self.monitor != "loss"

    @property
    def stall_window(self) -> int | None:
        """Epochs without improvement after the last unfreeze that end the run."""
        return self.patience if self.patience is not None else self.every


def _positive_int(value: object, param: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TorchMagicError(f"{param} must be a positive integer, got {value!r}", param=param)


def check_pacing(
    pacing: Pacing, has_val: bool, cached_features: bool, metrics: tuple[str, ...] = ()
) -> None:
    """Refuse, before any step, a combination that cannot work; ``metrics``: the run's
    named metrics, which ``monitor`` may name."""
    if pacing.every is not None:
        _positive_int(pacing.every, "every")
    if pacing.patience is not None:
        _positive_int(pacing.patience, "patience")
    if pacing.blocks:
        if (pacing.every is None) == (pacing.patience is None):
            raise TorchMagicError(
                "unfreeze needs exactly one of every (epochs between unfreezes) or patience "
                "(epochs without improvement)",
                param="unfreeze",
            )
        if cached_features:
            raise TorchMagicError(
                "cache_features trains the head alone: it cannot unfreeze blocks during the run",
                param="cache_features",
            )
    elif pacing.every is not None:
        raise TorchMagicError("every paces unfreeze: give the blocks to unfreeze", param="every")
    elif pacing.patience is not None and not pacing.early_stop:
        raise TorchMagicError(
            "patience without unfreeze needs early_stop (else it has nothing to pace)",
            param="patience",
        )
    if pacing.early_stop and pacing.stall_window is None:
        raise TorchMagicError(
            "early_stop needs patience (epochs without improvement)", param="early_stop"
        )
    if isinstance(pacing.lr_ratio, bool) or not (
        isinstance(pacing.lr_ratio, (int, float)) and 0 < pacing.lr_ratio < math.inf
    ):
        raise TorchMagicError(
            f"lr_ratio must be a positive number, got {pacing.lr_ratio!r}", param="lr_ratio"
        )
    if pacing.monitor not in (*BUILT_IN_MONITORS, *metrics):
        known = ", ".join(repr(m) for m in (*BUILT_IN_MONITORS, *metrics))
        raise TorchMagicError(
            f"monitor must be one of {known}, got {pacing.monitor!r}", param="monitor"
        )
    if not has_val and (pacing.needs_validation or pacing.monitor != "loss"):
        wants = [
            name
            for name, on in (
                ("patience", pacing.patience is not None),
                ("early_stop", pacing.early_stop),
                ("keep_best", pacing.keep_best),
                ("monitor", pacing.monitor != "loss"),
            )
            if on
        ]
        raise TorchMagicError(
            f"{', '.join(wants)} read(s) the validation metric: give val", param="val"
        )


class Pacer:
    """The state of one run's pacing: the best metric so far, when it was reached, when
    the last block was unfrozen, which block is next and at which base lr."""

    def __init__(self, pacing: Pacing) -> None:
        self.pacing = pacing
        self.best: float | None = None
        self.best_epoch = 0
        self.last_unfreeze = 0
        self.next_block = 0
        self.last_lr: float | None = None
        self.unfrozen: list[Unfrozen] = []

    def metric(self, epoch: EpochMetrics) -> float | None:
        """The monitored value of ``epoch``, larger-is-better sign folded in (None: not
        measured)."""
        monitor = self.pacing.monitor
        if monitor == "loss":
            value = epoch.val_loss
        elif monitor == "acc":
            value = epoch.val_accuracy
        else:
            value = epoch.val_metrics.get(monitor)
        return None if value is None else (-value if self.pacing.rising else value)

    def observe(self, epoch: int, value: float | None) -> bool:
        """Record epoch ``epoch``'s metric; True when it is a new best."""
        if value is None or value != value:
            return False
        if self.best is None or value < self.best:
            self.best, self.best_epoch = value, epoch
            return True
        return False

    def stalled(self, epoch: int) -> int:
        """Epochs since the later of the best epoch and the last unfreeze."""
        return epoch - max(self.best_epoch, self.last_unfreeze)

    def unfreeze_due(self, epoch: int) -> bool:
        pacing = self.pacing
        if self.next_block >= len(pacing.blocks):
            return False
        if pacing.every is not None:
            return epoch % pacing.every == 0
        return self.stalled(epoch) >= pacing.patience  # type: ignore[operator]

    def unfreeze_next(self, epoch: int) -> Unfrozen:
        """Unfreeze the next block through the session's hook, at its base lr."""
        pacing = self.pacing
        block = pacing.blocks[self.next_block]
        previous = self.last_lr if self.last_lr is not None else pacing.head_base_lr()  # type: ignore[misc]
        base_lr = previous * pacing.lr_ratio
        pacing.unfreeze(block, base_lr, epoch)  # type: ignore[misc]
        self.next_block += 1
        self.last_unfreeze = epoch
        self.last_lr = base_lr
        event = Unfrozen(epoch, block, base_lr)
        self.unfrozen.append(event)
        return event

    def stop_reason(self, epoch: int) -> str | None:
        """Why the run stops after ``epoch`` (early_stop), else None."""
        pacing = self.pacing
        window = pacing.stall_window
        if not pacing.early_stop or window is None or self.next_block < len(pacing.blocks):
            return None
        if self.stalled(epoch) < window:
            return None
        what = {"loss": "val loss", "acc": "val accuracy"}.get(pacing.monitor, pacing.monitor)
        since = "the last unfreeze" if self.last_unfreeze > self.best_epoch else "its best"
        best = -self.best if pacing.rising and self.best is not None else self.best
        return (
            f"early stop: {what} has not improved for {self.stalled(epoch)} epochs since "
            f"{since} (best {best:.4g} at epoch {self.best_epoch})"
        )


class BestWeights:
    """One host copy of the model's ``state_dict``, taken at each new best epoch."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.saved: dict[str, torch.Tensor] | None = None
        self.epoch: int | None = None

    def take(self, epoch: int) -> None:
        self.saved = {
            k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
        }
        self.epoch = epoch

    def restore(self) -> None:
        """Load the copy back (strict=False: an unfreeze may have swapped a
        FrozenBatchNorm2d, which has no ``num_batches_tracked``, for a BatchNorm2d)."""
        if self.saved is not None:
            self.model.load_state_dict(self.saved, strict=False)
