"""Renderables for training: live %fit progress, fit histories (one run or several side by
side, with a small chart when matplotlib is installed) and the AMP status."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, NewLine, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..core.training.amp import AmpStatus
from ..core.training.fit import EpochMetrics, FitHistory, FitStart, StepInfo
from ..core.training.progressive import Unfrozen
from .base import DEFAULT_WIDTH, Rendered, human, lr, table


def _num(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def _lrs(lrs: Sequence[float]) -> str:
    return ", ".join(lr(value) for value in lrs)


def _epoch_table(epochs: Sequence[EpochMetrics], title: str = "") -> Table:
    columns = ("epoch", "train loss", "val loss", "val acc", "samples/s", "s", "lr")
    drawn = table(title or None, [(c, "left" if c == "lr" else "right") for c in columns])
    for m in epochs:
        rate = m.samples / m.seconds if m.seconds else 0.0
        drawn.add_row(
            str(m.epoch),
            _num(m.train_loss),
            _num(m.val_loss),
            _pct(m.val_accuracy),
            human(rate),
            f"{m.seconds:.1f}",
            _lrs(m.lrs),
        )
    return drawn


def _step_text(info: StepInfo) -> str:
    batches = f"/{info.batches}" if info.batches else ""
    return (
        f"epoch {info.epoch}/{info.epochs} · step {info.step} · batch {info.batch}{batches}"
        f" · {human(info.samples_per_s)} samples/s · loss {info.loss:.4g} · lr {_lrs(info.lrs)}"
        + ("" if info.data_wait is None else f" · data wait {100 * info.data_wait:.0f} %")
    )


def _unfrozen_text(event: Unfrozen) -> str:
    return f"unfroze {event.block} after epoch {event.epoch} at base lr {lr(event.base_lr)}"


def _start_text(start: FitStart) -> str:
    """The run's first line: what trains, and when each scheduler steps."""
    schedules = ", ".join(f"{c.name} per {c.every} ({c.reason})" for c in start.schedules)
    return (
        f"{start.label} · {start.model_name} · {start.precision}"
        + (" · cached features" if start.cached_features else "")
        + f" · {start.epochs} epoch{'s' if start.epochs != 1 else ''}"
        + (f" · max {start.max_steps} steps" if start.max_steps is not None else "")
        + f" · schedulers: {schedules or 'none'}"
    )


def _step_line(info: StepInfo) -> RenderableType:
    if not info.batches:
        return Text(_step_text(info))
    # a ProgressBar ends without a newline: without one the text would follow on its line
    bar = ProgressBar(total=info.batches, completed=info.batch, width=40)
    return Group(bar, NewLine(), Text(_step_text(info)))


class NotebookProgress:
    """A %fit observer that redraws one output in place through a display handle."""

    refresh_seconds = 0.5

    def __init__(self, show: Callable[[Rendered], Any], width: int | None = None) -> None:
        self.width = width
        self.start: FitStart | None = None
        self.last: StepInfo | None = None
        self.epochs: list[EpochMetrics] = []
        self.unfrozen: list[Unfrozen] = []
        self.handle = show(self._rendered())

    def _rendered(self) -> Rendered:
        parts: list[RenderableType] = []
        if self.start is not None:
            parts.append(Text(_start_text(self.start), style="dim"))
        if self.last is not None:
            parts.append(_step_line(self.last))
        else:
            parts.append(Text("starting…", style="dim"))
        if self.epochs:
            parts.append(_epoch_table(self.epochs))
        parts.extend(Text(_unfrozen_text(e), style="cyan") for e in self.unfrozen)
        return Rendered(Group(*parts), self.width)

    def on_start(self, start: FitStart) -> None:
        self.start = start
        self.handle.update(self._rendered())

    def on_step(self, info: StepInfo) -> None:
        self.last = info
        self.handle.update(self._rendered())

    def on_epoch(self, metrics: EpochMetrics) -> None:
        self.epochs.append(metrics)
        self.handle.update(self._rendered())

    def on_unfreeze(self, event: Unfrozen) -> None:
        self.unfrozen.append(event)
        self.handle.update(self._rendered())

    def close(self) -> None:
        """Nothing to release: the output stays as the last update left it."""


class TerminalProgress:
    """A %fit observer for a terminal: a rich progress bar for the current epoch, with
    samples/s, running loss and lrs beside it, and a printed line per epoch."""

    refresh_seconds = 0.5

    def __init__(self, width: int = DEFAULT_WIDTH, console: Console | None = None) -> None:
        self.console = console or Console(
            width=width, markup=False, highlight=False, emoji=False, force_jupyter=False
        )
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            console=self.console,
            transient=True,
        )
        self.task: TaskID | None = None

    def on_start(self, start: FitStart) -> None:
        self.console.print(_start_text(start))

    def on_step(self, info: StepInfo) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("", status="")
        self.progress.update(
            self.task,
            description=f"epoch {info.epoch}/{info.epochs}",
            total=info.batches,
            completed=info.batch,
            status=f"{human(info.samples_per_s)} samples/s · loss {info.loss:.4g} · "
            f"lr {_lrs(info.lrs)}",
        )

    def on_epoch(self, metrics: EpochMetrics) -> None:
        self.console.print(
            f"epoch {metrics.epoch}: train loss {_num(metrics.train_loss)} · val loss "
            f"{_num(metrics.val_loss)} · val acc {_pct(metrics.val_accuracy)} · "
            f"{metrics.seconds:.1f} s"
        )

    def on_unfreeze(self, event: Unfrozen) -> None:
        self.console.print(_unfrozen_text(event))

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()
            self.task = None


def _chart(histories: Sequence[FitHistory]) -> str:
    """A small loss / accuracy chart as an inline PNG, or '' without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    except ImportError:
        return ""
    fig = Figure(figsize=(7, 2.4), dpi=80)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for h in histories:
        xs = [m.epoch for m in h.epochs]
        loss_ax.plot(xs, [m.train_loss for m in h.epochs], marker="o", label=f"{h.label} train")
        if any(m.val_loss is not None for m in h.epochs):
            loss_ax.plot(
                xs,
                [m.val_loss for m in h.epochs],
                linestyle="--",
                marker="o",
                label=f"{h.label} val",
            )
        if any(m.val_accuracy is not None for m in h.epochs):
            acc_ax.plot(xs, [m.val_accuracy for m in h.epochs], marker="o", label=h.label)
        for event in h.unfreezes:  # the block trains from the next epoch on
            for ax in (loss_ax, acc_ax):
                ax.axvline(event.epoch + 0.5, linestyle=":", linewidth=1, color="#888888")
            loss_ax.annotate(
                event.block,
                (event.epoch + 0.5, 1),
                xycoords=("data", "axes fraction"),
                fontsize=6,
                rotation=90,
                va="top",
                ha="right",
            )
    loss_ax.set_title("loss", fontsize=9)
    acc_ax.set_title("val accuracy", fontsize=9)
    for ax in (loss_ax, acc_ax):
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="fit history chart" src="data:image/png;base64,{data}"/>'


class HistoryView(Rendered):
    """A rendered view that also carries the histories it shows (``.histories``) and adds
    the chart to its HTML."""

    def __init__(
        self, renderable: RenderableType, histories: Sequence[FitHistory], width: int | None = None
    ) -> None:
        super().__init__(renderable, width)
        self.histories = tuple(histories)

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        bundle = super()._repr_mimebundle_(include, exclude)
        if "text/html" in bundle:
            bundle["text/html"] += _chart(self.histories)
        return bundle


@dataclass(frozen=True)
class FitRuns:
    """Every %fit run of a session, oldest first: what ``render`` compares side by side."""

    runs: tuple[FitHistory, ...]


def _ending(h: FitHistory) -> Text:
    if h.stopped:
        return Text(f"stopped: {h.stopped}", style="yellow")
    return Text("completed", style="green")


def fit_history(history: FitHistory, width: int | None = None) -> HistoryView:
    title = (
        f"{history.label} · {history.model_name} · {history.precision}"
        + (" · cached features" if history.cached_features else "")
        + f" · {history.steps} steps · {human(history.samples_per_s)} samples/s"
        + f" · {history.seconds:.1f} s"
    )
    if history.data_wait_share is not None:
        title += f" · data wait {100 * history.data_wait_share:.0f} %"
    parts: list[RenderableType] = [_epoch_table(history.epochs, title)]
    parts.extend(Text(_unfrozen_text(e), style="cyan") for e in history.unfreezes)
    if history.best_epoch is not None:
        parts.append(Text(f"weights of the best epoch ({history.best_epoch}) kept"))
    parts.append(_ending(history))
    return HistoryView(Group(*parts), [history], width)


def fits(histories: Sequence[FitHistory], width: int | None = None) -> HistoryView:
    """Every %fit of the session side by side: one column per run."""
    if not histories:
        return HistoryView(Text("no %fit runs yet", style="dim"), [], width)
    drawn = table("%fit runs", [("", "left"), *((h.label, "right") for h in histories)])
    last = [h.epochs[-1] if h.epochs else None for h in histories]
    rows = [
        ("model", [h.model_name for h in histories]),
        ("epochs", [str(len(h.epochs)) for h in histories]),
        ("steps", [str(h.steps) for h in histories]),
        ("train loss", [_num(m.train_loss) if m else "" for m in last]),
        ("val loss", [_num(m.val_loss) if m else "" for m in last]),
        ("val acc", [_pct(m.val_accuracy) if m else "" for m in last]),
        ("samples/s", [human(h.samples_per_s) for h in histories]),
        ("time (s)", [f"{h.seconds:.1f}" for h in histories]),
        ("precision", [h.precision for h in histories]),
        ("features", ["cached" if h.cached_features else "computed" for h in histories]),
        ("ended", ["stopped" if h.stopped else "completed" for h in histories]),
    ]
    for label, values in rows:
        drawn.add_row(label, *values)
    return HistoryView(drawn, histories, width)


def amp_status(status: AmpStatus, width: int | None = None) -> Rendered:
    if not status.enabled:
        head = Text("AMP off", style="bold")
    else:
        head = Text(f"AMP on: autocast {status.dtype} on {status.device_type}", style="bold green")
    parts: list[RenderableType] = [head]
    if status.scaler:
        scale = "" if status.scale is None else f", scale {status.scale:g}"
        parts.append(Text(f"GradScaler bound to the session{scale}"))
    elif status.enabled:
        parts.append(Text("no GradScaler (not needed for bf16)"))
    if status.note:
        parts.append(Text(status.note, style="dim"))
    return Rendered(Group(*parts), width)
