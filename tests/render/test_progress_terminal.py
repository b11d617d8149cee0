"""The terminal's live view under a screen that obeys the cursor: what was above a
%fit / %fine_tune stays, whatever the runs and the screen's height."""

from __future__ import annotations

import io
import re

from rich.console import Console

from torchmagic import render
from torchmagic.core.training.fit_events import EpochMetrics, FitHistory, FitStart, StepInfo

_CONTROL = re.compile(r"\x1b\[(\??)([0-9;]*)([A-Za-z])|\r|\n|[^\x1b\r\n]+")


class Screen:
    """A terminal of ``height`` rows and its scrollback, fed what a console wrote: text,
    CR, LF, cursor up (stopping at the screen's top row) and erase line; colours and
    cursor visibility are ignored."""

    def __init__(self, height: int) -> None:
        self.height = height
        self.lines = [""]
        self.row = self.col = 0

    def feed(self, raw: str) -> None:
        for match in _CONTROL.finditer(raw):
            token = match.group(0)
            if token == "\r":
                self.col = 0
            elif token == "\n":
                self.row += 1
                self.col = 0
                if self.row == len(self.lines):
                    self.lines.append("")
            elif match.group(3) == "A":
                top = max(0, len(self.lines) - self.height)
                self.row = max(top, self.row - int(match.group(2) or 1))
            elif match.group(3) == "K":
                self.lines[self.row] = ""
            elif not token.startswith("\x1b"):
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + token + line[self.col + len(token) :]
                self.col += len(token)

    def text(self) -> list[str]:
        return [line.rstrip() for line in self.lines]


def _terminal(height: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80, height=height, force_terminal=True), out


def _run(progress: render.TerminalProgress, label: str, epochs: int) -> FitHistory:
    progress.on_start(FitStart(label, "model", epochs, None, "fp32", False, ()))
    done = []
    for epoch in range(1, epochs + 1):
        for batch in range(1, 5):
            progress.on_step(StepInfo(epoch, epochs, batch, batch, 4, 50.0, 0.9, (1e-3,)))
        progress.on_validation_start(epoch, 2)
        done.append(EpochMetrics(epoch, 0.9, 0.8, 0.5, 32, 1.0, (1e-3,)))
        progress.on_epoch(done[-1])
    progress.close()
    return FitHistory(label, "model", tuple(done), 4 * epochs, 32 * epochs, float(epochs))


ABOVE = ["In [1]: x = 1", "earlier output", "In [2]: %fine_tune model train --val val"]


def _two_runs(height: int, epochs: int) -> list[str]:
    """What the screen and its scrollback hold after a two-run progress and its result."""
    console, out = _terminal(height)
    for line in ABOVE:
        console.print(line, highlight=False, markup=False)
    progress = render.TerminalProgress(console=console, clock=lambda: 0.0)
    runs = [_run(progress, "fit 1", epochs), _run(progress, "fit 2", epochs)]
    progress.finish(render.render(runs[1], 80))
    screen = Screen(height)
    screen.feed(out.getvalue())
    return screen.text()


def test_two_runs_leave_the_lines_above_them():
    """%fine_tune sends two runs: the second's first draw must not move up over the
    first's (erased) lines into the prompt and the output above it."""
    lines = _two_runs(24, 2)
    assert lines[: len(ABOVE)] == ABOVE
    assert lines[len(ABOVE)].startswith("fit 2 · model · fp32 · 8 steps")  # the result next
    assert not any("epochs done" in line for line in lines)  # no live line left behind


def test_a_view_taller_than_the_screen_erases_nothing_above_and_leaves_no_copies():
    lines = _two_runs(8, 6)
    assert lines[: len(ABOVE)] == ABOVE
    assert lines[len(ABOVE)].startswith("fit 2 · model")
    assert not any("epochs done" in line or "fit 1" in line for line in lines)
    assert sum(line.startswith("fit 2") for line in lines) == 1


def test_the_live_view_never_outgrows_the_screen():
    console, out = _terminal(8)
    progress = render.TerminalProgress(console=console, clock=lambda: 0.0)
    _run(progress, "fit 1", 5)
    frames = out.getvalue().split("\x1b[2K")
    drawn = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame) for frame in frames]
    assert max(frame.count("\n") for frame in drawn) <= 7
