"""Ctrl-C during a load ends it before (nothing changed, and the retry works) or after (the
load complete, and no refusal about undoing what it replayed).

Fault injection as in ``test_interrupts``: a clean load records the executed lines of the
engine; then a fresh build loads the same file with a KeyboardInterrupt raised at one of
them: every line of the load's own steps (reading, the replay and its copies, the check,
the states, the seal, the rollback) at its first and its last run, and a sample of the
rest (inside the replayed commands, which ``test_interrupts`` covers line by line).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

import torchmagic.core
from checkpoint_helpers import assert_same, build_net, loader, state, structure, train
from torchmagic import Session
from torchmagic.core.surgery.transaction import Uninterrupted, uninterrupted

ENGINE = str(Path(torchmagic.core.__file__).parent)
GUARD = {f.__code__ for f in (Uninterrupted.__enter__, Uninterrupted.__exit__, uninterrupted)}
GUARD_ENDS = {f.__code__ for f in (Uninterrupted.__enter__, Uninterrupted.__exit__)}
LOAD_STEPS = ("save_load.py", "replay.py", "restore.py", "weights_backup.py")
SAMPLE = 1999  # one line in so many of the others


class Injector:
    """Records the engine's (file, line) events, or raises KeyboardInterrupt at event
    ``at`` (Python then switches the trace off: one interrupt per run)."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at
        self.events: list[tuple[str, int]] = []

    def call(self, frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(ENGINE) or code in GUARD:
            return None
        if frame.f_back is not None and frame.f_back.f_code in GUARD_ENDS:
            return None
        return self.line

    def line(self, frame, event, arg):
        if event == "line":
            if len(self.events) == self.at:
                raise KeyboardInterrupt(f"injected at {frame.f_code.co_filename}:{frame.f_lineno}")
            self.events.append((frame.f_code.co_filename, frame.f_lineno))
        return self.line


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A file of commands with repetitions (copied on load, not run) and trained state."""
    model, opt, sched = build_net()
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("stem")
    for _ in range(3):
        tm.freeze("layer1")
        tm.unfreeze("layer1")
    tm.replace_head("fc", 4)
    tm.unfreeze("stem", lr=1e-3)
    train(model, opt, loader(), sched.step)
    path = tmp_path_factory.mktemp("load") / "run.pt"
    tm.save(path)
    return path


def _look(tm: Session, model, opt, sched) -> tuple:
    return (
        structure(model, opt),
        state(model, opt),
        copy.deepcopy(sched.state_dict()),
        [(e.command, e.stale) for e in tm.history()],
        [type(m).__name__ for m in model.modules()],
    )


def _same(a: tuple, b: tuple) -> bool:
    try:
        assert_same(a[0], b[0])
        assert_same(a[1], b[1])
    except AssertionError:
        return False
    return a[2:] == b[2:]


def _load(path, at: int | None) -> tuple[Injector, object, tuple, tuple, tuple]:
    model, opt, sched = build_net(seed=5)
    tm = Session(model, opt, schedulers=[sched])
    before = _look(tm, model, opt, sched)
    injector = Injector(at)
    raised: object = None
    sys.settrace(injector.call)
    try:
        tm.load(path)
    except BaseException as exc:  # what came out of the load, to be judged below
        raised = exc
    finally:
        sys.settrace(None)
    return injector, raised, before, _look(tm, model, opt, sched), (tm, model, opt, sched)


def _points(events: list[tuple[str, int]]) -> list[int]:
    first: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    for i, event in enumerate(events):
        first.setdefault(event, i)
        last[event] = i
    steps = {
        i for event in first if event[0].endswith(LOAD_STEPS) for i in (first[event], last[event])
    }
    return sorted(steps | set(range(0, len(events), SAMPLE)))


@pytest.mark.slow
def test_an_interrupt_anywhere_in_a_load_leaves_it_undone_or_complete(saved):
    clean, raised, _, after, _ = _load(saved, None)
    assert raised is None and len(after[3]) == 9
    points = _points(clean.events)
    assert len(points) > 100  # the load's own lines, each at its first and last run
    undone = complete = 0
    for at in points:
        injector, raised, before, now, (tm, model, opt, sched) = _load(saved, at)
        where = injector.events[-1] if injector.events else "?"
        assert isinstance(raised, KeyboardInterrupt), (at, where, raised)
        if _same(now, before):  # nothing changed: the retry works
            undone += 1
            tm.load(saved)
            assert _same(_look(tm, model, opt, sched), after), (at, where)
        else:
            complete += 1
            assert _same(now, after), (at, where)
    assert undone and complete  # both ends were reached
