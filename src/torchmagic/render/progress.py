"""Live %fit progress: one view of the run, drawn in a notebook (a display handle updated
in place) or in a terminal (a transient rich Live).

The view is the run's first line, the epochs finished so far, and a block of a fixed
height for what runs now, so the output does not jump between epochs or while validation
runs: a bar for the whole run (epochs done / total, elapsed<remaining for the run), a bar
for the epoch (step/total, elapsed<remaining for the epoch; the validating phase), and one
line of numbers (loss, lr per group when they differ, samples/s, data wait). A run counted
in steps (lr_find) has one bar: the run's.

Each run's ``close`` (the engine's) ends the live block; ``finish`` (the caller's, once,
after the last run) puts the result where the live view was: the run's facts are then
said once, by the result. Nothing is drawn before the loop's first event, so a %fit
refused up front leaves no "starting…" above its error. Time comes from ``clock`` (a
fake one in tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.segment import Segment
from rich.text import Text

from ..core.training.fit_events import EpochMetrics, FitStart, StepInfo
from ..core.training.progressive import Unfrozen
from . import theme
from .base import FONT, Fitted, OwnHtml, Rendered, html_text, human
from .surgery import change
from .training import (
    SIGNIFICANT,
    decimals,
    epoch_table,
    group_names,
    head_position,
    lr_text,
    step_text,
    unfrozen_text,
)

BAR_WIDTH = 30
MIN_BAR_WIDTH = 8


def clock_text(seconds: float) -> str:
    """12.3 → '00:12'; 3725 → '1:02:05'."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def schedulers_text(start: FitStart) -> str:
    """When each scheduler steps; a run that steps none says what is bound and that it
    is left as it was (lr_find)."""
    if start.schedules:
        return ", ".join(f"{c.name} per {c.every} ({c.reason})" for c in start.schedules)
    if start.held:
        return f"{', '.join(start.held)} (not stepped; restored after)"
    return "none"


def _start_text(start: FitStart) -> str:
    """The run's first line: what trains, and what each scheduler does."""
    steps_word = "max " if start.epochs else ""  # a run counted in steps runs them all
    return (
        f"{start.label} · {start.model_name} · {start.precision}"
        + (" · cached features" if start.cached_features else "")
        + step_text(start.accumulate, start.clip)
        + (f" · {_plural(start.epochs, 'epoch')}" if start.epochs else "")
        + (f" · {steps_word}{start.max_steps} steps" if start.max_steps is not None else "")
        + f" · schedulers: {schedulers_text(start)}"
    )


class BarLine(OwnHtml):
    """A bar and the words after it on one line: the bar gives way (down to
    ``MIN_BAR_WIDTH``) so that the words never wrap at a narrow width. In HTML the
    browser's width is not known here, so the bar's two parts shrink there, in
    proportion: a line that wrapped would make the live block taller than the closed one."""

    def __init__(self, fraction: float | None, words: str) -> None:
        self.fraction = fraction  # None: no bar (the total is not known)
        self.words = words

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.fraction is None:
            yield Text(self.words)
            return
        width = max(MIN_BAR_WIDTH, min(BAR_WIDTH, options.max_width - len(self.words) - 1))
        yield Text.assemble(*self._bar(width), " ", self.words)

    def _bar(self, width: int) -> list[Text]:
        """The bar ``width`` wide: its done and to-do parts (the thin to-do line tells
        them apart uncoloured), the empty ones left out."""
        filled = round(width * min(max(self.fraction or 0.0, 0.0), 1.0))
        parts = ((filled, "━", "bar_done"), (width - filled, "─", "bar_todo"))
        return [Text(char * n, style=theme.style(name)) for n, char, name in parts if n]

    def html(self) -> str:
        """One flex row: the done and to-do parts of the bar shrink by the same ratio,
        never below ``MIN_BAR_WIDTH`` together; the words keep their one line."""
        words = html_text(Text(self.words))
        bar = ""
        if self.fraction is not None:
            parts = "".join(
                f'<span style="flex:0 1 {len(part)}ch;min-width:0;overflow:hidden">'
                f"{html_text(part)}</span>"
                for part in self._bar(BAR_WIDTH)
            )
            bar = (
                f'<span style="display:flex;flex:0 1 {BAR_WIDTH}ch;min-width:{MIN_BAR_WIDTH}ch;'
                f'overflow:hidden">{parts}</span>'
            )
            words = " " + words
        return (
            f'<div class="torchmagic-bar" style="display:flex;white-space:pre;'
            f'line-height:1.3;{FONT}">{bar}<span style="flex:0 0 auto">{words}</span></div>'
        )


def _remaining(elapsed: float, fraction: float) -> str:
    """elapsed<remaining at the pace so far ('elapsed' alone before any progress)."""
    if fraction <= 0:
        return clock_text(elapsed)
    return f"{clock_text(elapsed)}<{clock_text(elapsed * (1 - min(fraction, 1.0)) / fraction)}"


class FitProgress:
    """The state of a running %fit, and how it reads (``view()``). Each ``on_start``
    begins a new run (%fine_tune sends two)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.earlier: list[RenderableType] = []  # reports and ended runs, shown above
        self._begin(None)

    def _begin(self, start: FitStart | None) -> None:
        self.start = start
        self.started = self.epoch_started = self.clock()
        self.last: StepInfo | None = None
        self.validating: tuple[int, int | None] | None = None  # (epoch, batches)
        self.epochs: list[EpochMetrics] = []
        self.unfrozen: list[Unfrozen] = []
        self.stopped: str | None = None  # why the run ended early
        self.ended: float | None = None  # the clock when the run closed
        self.loss_places: int | None = None  # the live loss's decimals: the run's first

    # -- events --------------------------------------------------------------------

    def _shelve(self) -> None:
        """The run before stays in view above what follows, as it ended."""
        if self.start is not None:
            self.earlier.append(Group(*self._run_parts(), self._ended_line()))
            self._begin(None)

    def on_start(self, start: FitStart) -> None:
        self._shelve()
        self._begin(start)

    def on_report(self, report: object) -> None:
        """A command between runs (fine_tune's freeze, its unfreeze), kept in view."""
        self._shelve()
        self.earlier.append(change(report).renderable)  # type: ignore[arg-type]

    def on_step(self, info: StepInfo) -> None:
        if self.loss_places is None:
            self.loss_places = decimals([info.loss], SIGNIFICANT + 1)
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

    def close(self) -> None:
        self.ended = self.clock()

    # -- reading -------------------------------------------------------------------

    @property
    def total_epochs(self) -> int | None:
        if self.start is not None:
            return self.start.epochs
        return self.last.epochs if self.last is not None else None

    @property
    def counted_in_steps(self) -> bool:
        """A run that cycles its loader for a number of steps (lr_find): no epochs."""
        return self.total_epochs == 0

    def _in_epoch(self) -> StepInfo | None:
        """The last step's snapshot when it belongs to the epoch under way."""
        info = self.last
        finished = self.epochs[-1].epoch if self.epochs else 0
        return info if info is not None and info.epoch > finished else None

    def run_fraction(self) -> float:
        """How much of the whole run is done: epochs (with the batches of the one under
        way), or optimizer steps against ``max_steps``, whichever is further."""
        total = self.total_epochs or 0
        info = self._in_epoch()
        done = float(len(self.epochs))
        if info is not None and info.batches:
            done += min(info.batch / info.batches, 1.0)
        fraction = done / total if total else 0.0
        max_steps = self.start.max_steps if self.start is not None else None
        if max_steps and self.last is not None:
            fraction = max(fraction, self.last.step / max_steps)
        return min(fraction, 1.0)

    # -- drawing -------------------------------------------------------------------

    def _numbers(self) -> Text:
        info = self.last
        if info is None:
            return Text("loss … · lr … · samples/s …", style=theme.style("dim"))
        numbers = Text(
            f"loss {info.loss:.{self.loss_places}f} · "
            f"lr {lr_text(info.lrs, group_names(info), head_position(info))} · "
            f"{human(info.samples_per_s)} samples/s"
            + ("" if info.data_wait is None else f" · data wait {100 * info.data_wait:.0f} %")
        )
        if self._in_epoch() is None and not self.counted_in_steps:
            numbers.stylize(theme.style("dim"))  # the last epoch's, until a step of this one
        return numbers

    def _run_line(self) -> BarLine:
        total = self.total_epochs or 0
        fraction = self.run_fraction()
        words = (
            f"{len(self.epochs)}/{total} epochs done · run {_remaining(self._elapsed(), fraction)}"
        )
        return BarLine(fraction, words)

    def _elapsed(self) -> float:
        return (self.ended if self.ended is not None else self.clock()) - self.started

    def _epoch_line(self) -> BarLine:
        info = self._in_epoch()
        elapsed = self.clock() - self.epoch_started
        total = self.total_epochs
        if info is None:
            following = len(self.epochs) + 1
            if total and following > total:
                return BarLine(1.0, f"epoch {total}/{total} · finishing…")
            of = f"/{total}" if total else ""
            return BarLine(0.0, f"epoch {following}{of} · starting…")
        if self.validating is not None:
            batches = self.validating[1]
            what = f"validating on {batches} batches…" if batches else "validating…"
            return BarLine(
                1.0, f"epoch {info.epoch}/{info.epochs} · {what} · {clock_text(elapsed)}"
            )
        if not info.batches:
            return BarLine(
                None,
                f"epoch {info.epoch}/{info.epochs} · step {info.batch} · {clock_text(elapsed)}",
            )
        fraction = info.batch / info.batches
        return BarLine(
            fraction,
            f"epoch {info.epoch}/{info.epochs} · step {info.batch}/{info.batches} · "
            f"{_remaining(elapsed, fraction)}",
        )

    def _step_line(self) -> BarLine:
        """The one bar of a run counted in steps."""
        info, steps = self.last, self.start.max_steps if self.start is not None else None
        done = info.step if info is not None else 0
        if not steps:
            return BarLine(None, f"step {done} · {clock_text(self._elapsed())}")
        fraction = done / steps
        return BarLine(fraction, f"step {done}/{steps} · {_remaining(self._elapsed(), fraction)}")

    def _ended_line(self) -> Text:
        """What replaces the live block when the run closes."""
        elapsed = clock_text(self._elapsed())
        if self.counted_in_steps:
            steps = f"{self.last.step} steps" if self.last is not None else "finished"
            line = Text(f"{steps} in {elapsed}", style=theme.style("dim"))
        else:
            total = f" of {self.total_epochs}" if self.total_epochs else ""
            count = f"{len(self.epochs)}{total} epoch{'' if self.total_epochs == 1 else 's'}"
            line = Text(f"{count} in {elapsed}", style=theme.style("dim"))
        if self.stopped is not None:  # a partial last epoch is counted: say it was cut
            line.append(f" · stopped: {self.stopped}")
        return line

    def running(self) -> list[RenderableType]:
        """The live block: the same number of lines from the first event to the end (a
        closed run's line last, under its last numbers), so nothing below it moves."""
        live: list[RenderableType] = (
            [self._step_line(), self._numbers()]
            if self.counted_in_steps
            else [self._run_line(), self._epoch_line(), self._numbers()]
        )
        if self.ended is None:
            return live
        numbers = self._numbers()
        numbers.stylize(theme.style("dim"))
        return [*(Text("") for _ in live[2:]), numbers, self._ended_line()]

    def _run_parts(self) -> list[RenderableType]:
        parts: list[RenderableType] = []
        if self.start is not None:
            parts.append(Text(_start_text(self.start), style=theme.style("dim")))
        if self.epochs:
            parts.append(epoch_table(self.epochs))
        parts += [Text(unfrozen_text(e), style=theme.style("info")) for e in self.unfrozen]
        return parts

    def view(self) -> RenderableType:
        return Group(*self.earlier, *self._run_parts(), *self.running())


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

    def _draw(self, drawn: Rendered) -> None:
        if self.handle is None:
            self.handle = self.show(drawn)
        else:
            self.handle.update(drawn)

    def _redraw(self) -> None:
        self._draw(Rendered(self.state.view(), self.width))

    def on_start(self, start: FitStart) -> None:
        self.state.on_start(start)
        self._redraw()

    def on_step(self, info: StepInfo) -> None:
        self.state.on_step(info)
        self._redraw()

    def on_validation_start(self, epoch: int, batches: int | None) -> None:
        self.state.on_validation_start(epoch, batches)
        self._redraw()

    def on_epoch(self, metrics: EpochMetrics) -> None:
        self.state.on_epoch(metrics)
        self._redraw()

    def on_unfreeze(self, event: Unfrozen) -> None:
        self.state.on_unfreeze(event)
        self._redraw()

    def on_report(self, report: object) -> None:
        self.state.on_report(report)

    def on_stop(self, message: str) -> None:
        self.state.on_stop(message)

    def discard(self) -> None:
        """A refused run: the drawing is emptied and ``close`` draws no summary."""
        if self.handle is not None:
            self._draw(Rendered(Text(""), self.width))
        self.handle = None

    def close(self) -> None:
        """The run ended: the live block becomes one line (nothing, if nothing was drawn)."""
        self.state.close()
        if self.handle is not None:
            self._redraw()

    def finish(self, result: Rendered | None = None) -> None:
        """The output becomes ``result`` (drawn where the live view was, or shown now);
        None keeps the view as the last run left it."""
        if result is not None:
            self._draw(result)


class ScreenTail:
    """The last lines of ``renderable`` that fit the terminal's screen (one row kept for
    the cursor). A live view redraws by moving the cursor up over its own height; taller
    than the screen, the cursor stops at the top row and each redraw would leave copies
    in the scrollback and wipe what is on the screen."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.renderable, options, pad=False)
        rows = max(1, console.height - 1)
        for line in lines[-rows:]:
            yield from line
            yield Segment.line()


class TerminalProgress:
    """A %fit observer for a terminal: the same view in a transient rich Live. ``finish``
    prints the result (or, without one, the view each run ended with). ``width`` None
    follows the terminal."""

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
        self.live: Live | None = None  # the run's; None between runs
        self.ended: list[RenderableType] = []  # each closed run's last view

    def _draw(self) -> None:
        if self.live is None:
            # a fresh Live per run: a stopped one still holds its last height, and its
            # next draw would move up over (and erase) that many lines above it
            self.live = Live(console=self.console, auto_refresh=False, transient=True)
            self.live.start()
        self.live.update(ScreenTail(Fitted(self.state.view())), refresh=True)

    def _stop(self) -> bool:
        """Erase the live lines; False when nothing was drawn."""
        if self.live is None:
            return False
        self.live.stop()
        self.live = None
        return True

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

    def on_report(self, report: object) -> None:
        self.state.on_report(report)

    def on_stop(self, message: str) -> None:
        self.state.on_stop(message)

    def discard(self) -> None:
        """A refused run: the transient view goes and ``close`` prints no summary."""
        self._stop()

    def close(self) -> None:
        """The run ended: its live lines are erased, its last view kept for ``finish``."""
        if self._stop():
            self.state.close()
            self.ended.append(self.state.view())

    def finish(self, result: Rendered | None = None) -> None:
        """Print ``result``; None prints the view each run ended with."""
        shown = [result.renderable] if result is not None else self.ended
        for renderable in shown:
            self.console.print(Fitted(renderable))
        self.ended = []
