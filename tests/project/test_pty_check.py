"""The pure parts of tools/pty_check.py (make pty-check): what counts as a line erased by
%fine_tune, a refusal's answer, a wrapped line, on captured text; and the emulated screen's
wrap detection, with pyte where it is installed. No pty, no IPython."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from paths import ROOT


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pty_check", ROOT / "tools/pty_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pty_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


pc = _load()

BEFORE = ["In [8]: %fit a", "fit 1 · model", "completed", "", "In [9]: "]


def test_lines_kept_in_place_are_no_loss_and_the_prompt_line_is_left_out():
    after = [*BEFORE[:-1], "In [9]: %fine_tune a --val b --epochs 1", "froze everything"]
    assert pc.lost_lines(BEFORE, after) == []


def test_a_line_erased_or_moved_by_the_command_is_lost():
    erased = ["In [8]: %fit a", "fit 1 · model", "", "", "In [9]: %fine_tune"]
    assert pc.lost_lines(BEFORE, erased) == ["completed"]
    assert pc.lost_lines(BEFORE, BEFORE[:2]) == ["completed", ""]


def test_answer_of_is_what_a_command_printed_up_to_the_next_prompt():
    lines = ["In [10]: %fit a --epoch 2", "UsageError: unknown option --epoch", "", "In [11]:"]
    assert pc.answer_of(lines, "%fit a --epoch 2") == ["UsageError: unknown option --epoch"]
    with pytest.raises(ValueError):
        pc.answer_of(lines, "%summary")


def _capture(lines, wrapped=()):
    return pc.Capture(60, lines=list(lines), wrapped=list(wrapped))


def test_judge_passes_a_clean_capture_and_names_each_failure():
    help_ = [f"In [2]: {pc.HELP}", "%fit [MODEL] TRAIN_LOADER", "", "reference: x"]
    clean = [*help_, *BEFORE[:-1], f"In [9]: {pc.FINE_TUNE}", f"In [10]: {pc.REFUSED}", "x"]
    capture = _capture(clean)
    pc.judge(capture, [*help_, *BEFORE])
    assert capture.failures == [] and capture.longest == len(f"In [9]: {pc.FINE_TUNE}")
    bad = _capture(
        [f"In [2]: {pc.HELP}", "UsageError: x", "In [8]: %fit a", "", "", ""]
        + [f"In [10]: {pc.REFUSED}", "UsageError: x", "  at y"],
        wrapped=["x" * 60],
    )
    pc.judge(bad, [f"In [2]: {pc.HELP}", "UsageError: x", *BEFORE])
    assert [f.split(":")[0] for f in bad.failures] == [
        "a line longer than 60 columns",
        "%fine_tune erased or moved a line above it",
        "%fine_tune erased or moved a line above it",
        f"{pc.HELP!r} answered ['UsageError",
        f"{pc.REFUSED!r} answered 2 lines, not one",
    ]


def test_the_screen_notes_a_line_the_terminal_had_to_wrap():
    pyte = pytest.importorskip("pyte")
    screen = pc._screen_class()(10, 3, lambda data: None)
    stream = pyte.Stream(screen)
    stream.feed("0123456789\r\n")  # exactly the width: the cursor waits, nothing wraps
    assert screen.wraps == []
    stream.feed("0123456789ab")
    assert screen.wraps == ["0123456789"]
    stream.feed("\x1b[?7l" + "x" * 15)  # autowrap off (prompt_toolkit's drawing): no wrap
    assert screen.wraps == ["0123456789"]
