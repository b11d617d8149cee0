"""What a fit run tells its observer, and what it returns: the start, progress snapshots,
each epoch's metrics, the history, and why a run stopped early. The observer protocol
lives here too, with the silent observer a plan gets by default."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from .progressive import Unfrozen
from .schedule_steps import ScheduleChoice

if TYPE_CHECKING:
    from ..export import InferenceReport


class StopReason(Enum):
    """Why a run ended before its last epoch."""

    MAX_STEPS = "max_steps"
    INTERRUPTED = "interrupted"
    NON_FINITE_LOSS = "non_finite_loss"
    EARLY_STOP = "early_stop"
    NO_METRIC = "no_metric"  # the monitored validation metric is not measured


@dataclass(frozen=True)
class FitStart:
    """What a run is about to do: sent to the observer before the first step."""

    label: str
    model_name: str
    epochs: int  # 0: a run counted in steps only (lr_find)
    max_steps: int | None
    precision: str
    cached_features: bool
    schedules: tuple[ScheduleChoice, ...]
    accumulate: int = 1  # loader batches per optimizer step
    clip: float | None = None  # the largest total gradient norm
    held: tuple[str, ...] = ()  # schedulers bound to the optimizer that the run never steps


@dataclass(frozen=True)
class StepInfo:
    """A progress snapshot: sent to the observer at most every ``refresh_seconds``.
    Steps are optimizer steps: ``batch`` of ``batches`` counts this epoch's (one per
    ``accumulate`` loader batches), ``step`` the run's."""

    epoch: int
    epochs: int
    step: int
    batch: int
    batches: int | None
    samples_per_s: float
    loss: float
    lrs: tuple[float, ...]
    data_wait: float | None = None  # share of this epoch's time so far spent waiting for batches
    groups: tuple[str, ...] = ()  # the names of the groups ``lrs`` belong to
    head: int | None = None  # the position in ``lrs`` of the group training the head


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch; ``lrs`` are those its last step trained at; ``val_metrics``: the
    run's named metrics (torchmetrics) on the validation data, by name."""

    epoch: int
    train_loss: float
    val_loss: float | None
    val_accuracy: float | None
    samples: int
    seconds: float
    lrs: tuple[float, ...]
    groups: tuple[str, ...] = ()  # the names of the groups ``lrs`` belong to
    head: int | None = None  # the position in ``lrs`` of the group training the head
    val_metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FitHistory:
    """One fit run: per-epoch metrics and how it ended."""

    label: str
    model_name: str
    epochs: tuple[EpochMetrics, ...]
    steps: int
    samples: int
    seconds: float
    stopped: str | None = None  # why it ended early, in words; None when it ran to the end
    cached_features: bool = False
    precision: str = "fp32"
    stop_reason: StopReason | None = None
    schedules: tuple[ScheduleChoice, ...] = ()
    unfreezes: tuple[Unfrozen, ...] = ()  # (epoch, block, base lr) of each progressive unfreeze
    best_epoch: int | None = None  # keep_best: the epoch whose weights the model holds now
    data_wait_s: float = 0.0  # waiting for batches (see ``batch_sources``)
    wall_s: float = 0.0  # the training passes' time, validation excluded
    accumulate: int = 1  # loader batches per optimizer step (``steps`` counts these steps)
    clip: float | None = None  # the largest total gradient norm
    metrics: tuple[str, ...] = ()  # the named metrics measured after each epoch
    monitor: str | None = None  # what keep_best, early stop and patience followed
    exported: InferenceReport | None = None  # the weights written for inference after the run
    not_exported: str | None = None  # why a run given a path to export to wrote nothing

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def data_wait_share(self) -> float | None:
        return self.data_wait_s / self.wall_s if self.wall_s > 0 else None


class FitObserver(Protocol):
    refresh_seconds: float

    def on_start(self, start: FitStart) -> None: ...

    def on_step(self, info: StepInfo) -> None: ...

    def on_validation_start(self, epoch: int, batches: int | None) -> None: ...

    def on_epoch(self, metrics: EpochMetrics) -> None: ...

    def on_unfreeze(self, event: Unfrozen) -> None: ...

    def close(self) -> None: ...


def discard_progress(observer: FitObserver) -> None:
    """A run refused at its first step leaves no progress behind (the refusal is the one
    line shown); ``discard`` is optional for observers."""
    discard = getattr(observer, "discard", None)
    if discard is not None:
        discard()


def report_progress(observer: FitObserver | None, report: object) -> None:
    """A command run between two runs of one observer (fine_tune's freeze and unfreeze),
    shown with the runs while they go on; ``on_report`` is optional for observers."""
    on_report = getattr(observer, "on_report", None)
    if on_report is not None:
        on_report(report)


class SilentObserver:
    """Shows nothing: the observer of a plan given none."""

    refresh_seconds = float("inf")

    def on_start(self, start: FitStart) -> None:
        pass

    def on_step(self, info: StepInfo) -> None:
        pass

    def on_validation_start(self, epoch: int, batches: int | None) -> None:
        pass

    def on_epoch(self, metrics: EpochMetrics) -> None:
        pass

    def on_unfreeze(self, event: Unfrozen) -> None:
        pass

    def close(self) -> None:
        pass
