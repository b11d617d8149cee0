"""Run a short torchmagic session in a real terminal IPython under a pty and check the screen.

A notebook hides what a terminal does to output: a line one column too long wraps, a
transient progress that clears too much erases the lines above it. This tool starts
``ipython`` (prompt_toolkit, not ``--simple-prompt``) on a pseudo-terminal of each width,
types a script of magics into it (``%tm help fit``, a model, ``%freeze``, ``%summary``, a
head swapped by hand and ``%tm doctor``'s finding, ``%fit``, ``%fine_tune``, a refused
line), emulates the terminal with pyte and checks, per width:

* no output line is longer than the terminal (the emulator saw no character wrap),
* ``%tm help fit`` answers with its usage and ends with where the reference is,
* every line on screen or in the scrollback before ``%fine_tune`` is still there, in place,
  after it,
* a refused line answers with exactly one line.

The captures (scrollback + final screen) go to build/ui/pty-<cols>.txt. Exit status 1 when
a check fails, 2 when pyte or IPython is missing.

Usage: python tools/pty_check.py [--columns 60,80,100] [--out build/ui]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROWS = 40
SETUP = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class TinyNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.layer2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(self.pool(self.layer2(self.layer1(x))).flatten(1))


model = TinyNet()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
images, labels = torch.randn(64, 3, 16, 16), torch.randint(0, 3, (64,))
train_loader = DataLoader(TensorDataset(images[:48], labels[:48]), batch_size=8)
val_loader = DataLoader(TensorDataset(images[48:], labels[48:]), batch_size=8)
"""
FINE_TUNE = "%fine_tune train_loader --val val_loader --epochs 1"
REFUSED = "%fit train_loader --epoch 2"
HELP = "%tm help fit"
SCRIPT = (
    "%load_ext torchmagic",
    HELP,
    "%run -i {setup}",
    "%freeze model.layer1",
    "%summary",
    "model.fc = nn.Linear(16, 3)",
    "%tm doctor",
    "%unfreeze model.fc",
    "%fit train_loader --val val_loader --epochs 2",
    FINE_TUNE,
    REFUSED,
)
PROMPT = re.compile(r"^In \[(\d+)\]:(?: |$)")


# -- pure checks on captured lines -----------------------------------------------------------


def lost_lines(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """Lines captured before a command that are not in the same place after it. The last
    line before is the prompt the command is typed at, so it is left out."""
    kept = list(before[:-1])
    return [line for i, line in enumerate(kept) if i >= len(after) or after[i] != line]


def answer_of(lines: Sequence[str], typed: str) -> list[str]:
    """The non-blank lines a command printed: after its input line, before the next prompt."""
    for start, line in enumerate(lines):
        if PROMPT.match(line) and line[PROMPT.match(line).end() :].rstrip() == typed:
            answer = []
            for following in lines[start + 1 :]:
                if PROMPT.match(following):
                    return answer
                if following.strip():
                    answer.append(following)
            return answer
    raise ValueError(f"{typed!r} is not in the capture")


@dataclass
class Capture:
    """One session at one width: the lines, the wraps, the checks."""

    columns: int
    lines: list[str] = field(default_factory=list)
    wrapped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def longest(self) -> int:
        return max((len(line) for line in self.lines), default=0)


def judge(capture: Capture, before_fine_tune: Sequence[str]) -> None:
    """Every assertion on one capture."""
    for line in capture.wrapped:
        capture.failures.append(f"a line longer than {capture.columns} columns: {line!r}")
    for line in lost_lines(before_fine_tune, capture.lines):
        capture.failures.append(f"%fine_tune erased or moved a line above it: {line!r}")
    usage = answer_of(capture.lines, HELP)
    if not usage or not usage[0].startswith("%fit ") or "reference:" not in usage[-1]:
        capture.failures.append(f"{HELP!r} answered {usage[:1]} … {usage[-1:]}, not the usage")
    refusal = answer_of(capture.lines, REFUSED)
    if len(refusal) != 1:
        capture.failures.append(f"{REFUSED!r} answered {len(refusal)} lines, not one: {refusal}")


# -- the terminal ---------------------------------------------------------------------------


def _screen_class() -> Any:
    """A pyte screen with scrollback that notes every line the terminal had to wrap and
    answers cursor-position queries (prompt_toolkit asks)."""
    import pyte
    from pyte import modes

    class WrapNotingScreen(pyte.HistoryScreen):
        def __init__(self, columns: int, rows: int, answer: Any) -> None:
            super().__init__(columns, rows, history=100_000, ratio=0.5)
            self.wraps: list[str] = []
            self.answer = answer

        def draw(self, data: str) -> None:
            for char in data:
                if self.cursor.x >= self.columns and modes.DECAWM in self.mode:
                    self.wraps.append(self.display[self.cursor.y].rstrip())
                super().draw(char)

        def write_process_input(self, data: str) -> None:
            self.answer(data.encode())

    return WrapNotingScreen


def _text(screen: Any) -> list[str]:
    """Scrollback then screen, one string per row, right-stripped, trailing blanks dropped."""
    rows = [
        "".join(row[x].data for x in range(screen.columns)).rstrip() for row in screen.history.top
    ]
    rows += [row.rstrip() for row in screen.display]
    while rows and not rows[-1]:
        rows.pop()
    return rows


class Terminal:
    """IPython on a pty of a given size, fed to a pyte screen."""

    def __init__(self, columns: int, scratch: Path) -> None:
        import pyte

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, columns, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env.update(
            TERM="xterm-256color",
            IPYTHONDIR=str(scratch / "ipython"),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])),
            TORCH_HOME=env.get("TORCH_HOME", str(ROOT / "build" / "torch_home")),
        )
        command = [
            sys.executable,
            "-m",
            "IPython",
            "--no-banner",
            "--HistoryManager.enabled=False",
            "--TerminalInteractiveShell.autoindent=False",
            "--TerminalInteractiveShell.confirm_exit=False",
            "--TerminalInteractiveShell.autosuggestions_provider=None",
        ]
        self.process = subprocess.Popen(
            command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.screen = _screen_class()(columns, ROWS, self._write)
        self.stream = pyte.ByteStream(self.screen)

    def _write(self, data: bytes) -> None:
        os.write(self.master, data)

    def _pump(self, seconds: float) -> bool:
        """Feed what arrives within ``seconds``; False when nothing did."""
        ready, _, _ = select.select([self.master], [], [], seconds)
        if not ready:
            return False
        try:
            self.stream.feed(os.read(self.master, 65536))
        except OSError:  # the child closed the pty
            return False
        return True

    def wait_for_prompt(self, number: int, limit_s: float = 600) -> None:
        """Until ``In [number]:`` is the cursor's line and the output is quiet."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self._pump(0.3):
                continue
            line = self.screen.display[self.screen.cursor.y]
            match = PROMPT.match(line)
            if match and int(match.group(1)) == number:
                return
        raise TimeoutError(f"no prompt In [{number}] within {limit_s:.0f} s:\n" + self.dump())

    def type_line(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    def lines(self) -> list[str]:
        return _text(self.screen)

    def dump(self) -> str:
        return "\n".join(self.lines()[-20:])

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        os.close(self.master)


def capture_session(columns: int, scratch: Path) -> Capture:
    """The script typed into IPython at this width, and the checks on what it showed."""
    setup = scratch / "setup.py"
    setup.write_text(SETUP)
    terminal = Terminal(columns, scratch)
    capture = Capture(columns)
    try:
        terminal.wait_for_prompt(1, limit_s=120)
        before_fine_tune: list[str] = []
        for number, line in enumerate(SCRIPT, start=1):
            line = line.format(setup=setup)
            if line == FINE_TUNE:
                before_fine_tune = terminal.lines()
            terminal.type_line(line)
            terminal.wait_for_prompt(number + 1)
        capture.lines = terminal.lines()
        capture.wrapped = list(terminal.screen.wraps)
    finally:
        terminal.close()
    judge(capture, before_fine_tune)
    return capture


def _columns(text: str) -> tuple[int, ...]:
    try:
        columns = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        columns = ()
    if not columns or any(c < 40 or c > 300 for c in columns):
        raise argparse.ArgumentTypeError(f"columns are 40 to 300, comma-separated, got {text!r}")
    return columns


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--columns", type=_columns, default=(60, 80, 100), help="widths")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "ui", help="captures")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0 all checks passed, 1 some failed, 2 tools missing."""
    args = parse_args(argv)
    try:
        import IPython  # noqa: F401
        import pyte  # noqa: F401
    except ImportError as exc:
        print(f"pty-check needs {exc.name} ({sys.executable} -m pip install {exc.name})")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    for columns in args.columns:
        with tempfile.TemporaryDirectory(prefix="tm-pty-check-") as scratch:
            capture = capture_session(columns, Path(scratch))
        path = args.out / f"pty-{columns}.txt"
        path.write_text("\n".join(capture.lines) + "\n")
        for failure in capture.failures:
            print(f"FAIL {columns} columns: {failure}")
        failed |= bool(capture.failures)
        print(
            f"{columns} columns: {len(capture.lines)} lines, longest {capture.longest}, "
            f"{len(capture.wrapped)} wrapped, {len(capture.failures)} failures -> {path}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
