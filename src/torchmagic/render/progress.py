"""Live %fit progress: one view of the run, drawn in a notebook (a display handle updated
in place) or in a terminal (a transient rich Live).

The view shows the epochs finished so far and two lines for the one running: a bar with
epoch, step/total and elapsed<remaining, then loss, lr (per group when they differ) and
samples/s. While validation runs it says so. At the end the live area is replaced by one
summary line: the epoch table itself is the cell's result, so it appears once.

Nothing is drawn before the loop's first event, so a %fit refused up front leaves no
"starting…" above its error. Time comes from ``clock`` (a fake one in tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from ..core.training.fit import EpochMetrics, FitStart, StepInfo
from ..core.training.progressive import Unfrozen
from . import theme
from .base import Fitted, Rendered, human
from .training import epoch_table, group_names, lr_text, step_text, unfrozen_text

BAR_WIDTH = 30


def clock_text(seconds: float) -> str:
    """12.3 → '00:12'; 3725 → '1:02:05'."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _start_text(start: FitStart) -> str:
    """The run's first line: what trains, and when each scheduler steps."""
    schedules = ", ".join(f"{c.name} per {c.every} ({c.reason})" for c in start.schedules)
    return (
        f"{start.label} · {start.model_name} · {start.precision}"
        + (" · cached features" if start.cached_features else "")
        + step_text(start.accumulate, start.clip)
        + (f" · {start.epochs} epoch{'s' if start.epochs != 1 else ''}" if start.epochs else "")
        + (f" · max {start.max_steps} steps" if start.max_steps is not None else "")
        + f" · schedulers: {schedules or 'none'}"
    )


def _bar(done: int, total: int) -> Text:
    filled = round(BAR_WIDTH * min(done, total) / total) if total else 0
    return Text.assemble(
        ("━" * filled, theme.style("bar_done")),
        ("─" * (BAR_WIDTH - filled), theme.style("bar_todo")),  # thin: tells apart uncoloured
        " ",
    )


class FitProgress:
    """The state of a running %fit, and how it reads: ``view()`` while it runs,
    ``summary()`` once it ends."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = self.epoch_started = clock()
        self.start: FitStart | None = None
        self.last: StepInfo | None = None
        self.validating: tuple[int, int | None] | None = None  # (epoch, batches)
        self.epochs: list[EpochMetrics] = []
        self.unfrozen: list[Unfrozen] = []
        self.stopped: str | None = None  # why the run ended early

    # -- events --------------------------------------------------------------------

    def on_start(self, start: FitStart) -> None:
        self.start = start
        self.started = self.epoch_started = self.clock()

    def on_step(self, info: StepInfo) -> None:
        self.last = info
        self.validating = None

    def on_validation_start(self, epoch: int, batches: int | None) -> None:
        self.validating = (epoch, batches)

    def on_epoch(self, metrics: EpochMetrics) -> None:
        self.epochs.append(metrics)
        self.validating = None
        self.epoch_started = self.clock()

    def on_unfreeze(self, event: Unfrozen) -> None:
        self.unfrozen.append(event)

    def on_stop(self, message: str) -> None:
        self.stopped = message

    # -- drawing -------------------------------------------------------------------

    @property
    def total_epochs(self) -> int | None:
        if self.start is not None:
            return self.start.epochs
        return self.last.epochs if self.last is not None else None

    def _running(self) -> list[Text]:
        """The lines of the epoch under way (none between epochs)."""
        info = self.last
        finished = self.epochs[-1].epoch if self.epochs else 0
        if info is None or info.epoch <= finished:
            following = finished + 1
            if self.total_epochs is not None and following > self.total_epochs:
                return []
            of = f"/{self.total_epochs}" if self.total_epochs else ""
            return [Text(f"epoch {following}{of} …", style=theme.style("dim"))]
        elapsed = self.clock() - self.epoch_started
        numbers = Text(
            f"loss {info.loss:.4g} · lr {lr_text(info.lrs, group_names(info))} · "
            f"{human(info.samples_per_s)} samples/s"
            + ("" if info.data_wait is None else f" · data wait {100 * info.data_wait:.0f} %")
        )
        if self.validating is not None:
            batches = self.validating[1]
            what = f"validating on {batches} batches…" if batches else "validating…"
            head = Text(f"epoch {info.epoch}/{info.epochs} · {what} · {clock_text(elapsed)}")
            return [head, numbers]
        if not info.batches:
            head = Text(
                f"epoch {info.epoch}/{info.epochs} · step {info.batch} · {clock_text(elapsed)}"
            )
            return [head, numbers]
        remaining = elapsed * (info.batches - info.batch) / info.batch if info.batch else 0.0
        head = _bar(info.batch, info.batches)
        head.append(
            f"epoch {info.epoch}/{info.epochs} · step {info.batch}/{info.batches} · "
            f"{clock_text(elapsed)}<{clock_text(remaining)}"
        )
        return [head, numbers]

    def view(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self.start is not None:
            parts.append(Text(_start_text(self.start), style=theme.style("dim")))
        if self.epochs:
            parts.append(epoch_table(self.epochs))
        parts += [Text(unfrozen_text(e), style=theme.style("info")) for e in self.unfrozen]
        parts += self._running()
        return Group(*parts)

    def summary(self) -> RenderableType:
        """What replaces the live view: the run's first line (what it trained with, how
        each scheduler steps), the blocks unfrozen on the way, and one line of outcome;
        the table is the cell's result."""
        label = self.start.label if self.start is not None else "%fit"
        total = f" of {self.total_epochs}" if self.total_epochs else ""
        done = len(self.epochs)
        count = f"{done}{total} epoch{'s' if (self.total_epochs or done) != 1 else ''} in "
        if self.total_epochs == 0:  # counted in steps: the result says how many ran
            count = "finished in "
        line = Text(
            f"{label}: {count}{clock_text(self.clock() - self.started)}",
            style=theme.style("dim"),
        )
        if self.epochs:
            last = self.epochs[-1]
            line.append(f" · train loss {last.train_loss:.4g}")
            if last.val_accuracy is not None:
                line.append(f" · val acc {100 * last.val_accuracy:.1f}%")
        if self.stopped is not None:  # a partial last epoch is counted: say it was cut
            line.append(f" · stopped: {self.stopped}")
        parts: list[RenderableType] = []
        if self.start is not None:
            parts.append(Text(_start_text(self.start), style=theme.style("dim")))
        parts += [Text(unfrozen_text(e), style=theme.style("info")) for e in self.unfrozen]
        return Group(*parts, line) if parts else line


class NotebookProgress:
    """A %fit observer that redraws one notebook output in place through a display
    handle (``show`` displays the first drawing and returns the handle)."""

    refresh_seconds = 0.5

    def __init__(
        self,
        show: Callable[[Rendered], Any],
        width: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.show = show
        self.width = width
        self.state = FitProgress(clock)
        self.handle: Any = None

    def _draw(self, renderable: RenderableType) -> None:
        drawn = Rendered(renderable, self.width)
        if self.handle is None:
            self.handle = self.show(drawn)
        else:
            self.handle.update(drawn)

    def on_start(self, start: FitStart) -> None:
        self.state.on_start(start)
        self._draw(self.state.view())

    def on_step(self, info: StepInfo) -> None:
        self.state.on_step(info)
        self._draw(self.state.view())

    def on_validation_start(self, epoch: int, batches: int | None) -> None:
        self.state.on_validation_start(epoch, batches)
        self._draw(self.state.view())

    def on_epoch(self, metrics: EpochMetrics) -> None:
        self.state.on_epoch(metrics)
        self._draw(self.state.view())

    def on_unfreeze(self, event: Unfrozen) -> None:
        self.state.on_unfreeze(event)
        self._draw(self.state.view())

    def on_stop(self, message: str) -> None:
        self.state.on_stop(message)

    def discard(self) -> None:
        """A refused run: the drawing is emptied and ``close`` draws no summary."""
        if self.handle is not None:
            self._draw(Text(""))
        self.handle = None

    def close(self) -> None:
        """The live view becomes the one-line summary (nothing, if nothing was drawn)."""
        if self.handle is not None:
            self._draw(self.state.summary())


class TerminalProgress:
    """A %fit observer for a terminal: the same view in a transient rich Live, then the
    summary line. ``width`` None follows the terminal."""

    refresh_seconds = 0.5

    def __init__(
        self,
        width: int | None = None,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console or Console(
            width=width, markup=False, highlight=False, emoji=False, force_jupyter=False
        )
        self.state = FitProgress(clock)
        self.live = Live(
            console=self.console,
            auto_refresh=False,
            transient=True,
            vertical_overflow="visible",
        )
        self.running = False

    def _draw(self) -> None:
        if not self.running:
            self.live.start()
            self.running = True
        self.live.update(Fitted(self.state.view()), refresh=True)

    def on_start(self, start: FitStart) -> None:
        self.state.on_start(start)
        self._draw()

    def on_step(self, info: StepInfo) -> None:
        self.state.on_step(info)
        self._draw()

    def on_validation_start(self, epoch: int, batches: int | None) -> None:
        self.state.on_validation_start(epoch, batches)
        self._draw()

    def on_epoch(self, metrics: EpochMetrics) -> None:
        self.state.on_epoch(metrics)
        self._draw()

    def on_unfreeze(self, event: Unfrozen) -> None:
        self.state.on_unfreeze(event)
        self._draw()

    def on_stop(self, message: str) -> None:
        self.state.on_stop(message)

    def discard(self) -> None:
        """A refused run: the transient view goes and ``close`` prints no summary."""
        if self.running:
            self.live.stop()
            self.running = False

    def close(self) -> None:
        if self.running:
            self.live.stop()
            self.running = False
            self.console.print(self.state.summary())
