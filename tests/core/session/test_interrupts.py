"""Ctrl-C never half-applies a command.

Fault injection: a clean run of each mutating command (and of undo) records the executed
lines of the engine (``sys.settrace`` over torchmagic.core, plus torch's grad_mode.py for
``torch.no_grad()``); then, for each recorded line (at its first and its last run), a
fresh model runs the same command with a KeyboardInterrupt raised there. The interrupt
must come out, and afterwards the model, optimizer, scheduler, BatchNorm layers, grad mode
and history must be exactly as before the command or exactly as after it (with the
history agreeing).

The injected exception stands for an interrupt that is *not* held back: the engine holds
SIGINT while it mutates (``Uninterrupted``), and must still be right when a
KeyboardInterrupt propagates from any line. The guard's own lines are not injected: a
real SIGINT there arrives before the guard is up (nothing changed yet) or after it is
down (all done).
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from IPython.utils.capture import capture_output
from torch import nn
from torch.autograd import grad_mode

import torchmagic.core
from builders import cnn_with_decay_groups
from snapshots import equal
from torchmagic import Change, Session, render
from torchmagic.core.registry import REGISTRY
from torchmagic.core.surgery import optimizer_sync
from torchmagic.core.surgery.transaction import Transaction, Uninterrupted, uninterrupted
from torchmagic.magics.extension import loaded

ENGINE = str(Path(torchmagic.core.__file__).parent)
GRAD_MODE = grad_mode.__file__
# the guard: its own lines, and what its entry and exit call (torch.set_grad_enabled)
GUARD = {f.__code__ for f in (Uninterrupted.__enter__, Uninterrupted.__exit__, uninterrupted)}
GUARD_ENDS = {f.__code__ for f in (Uninterrupted.__enter__, Uninterrupted.__exit__)}
# engine files each of whose lines the quick test injects (the rest are sampled)
ALWAYS = ("optimizer_sync.py", "transaction.py", "history.py", "edits.py", "batchnorm.py")


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of tiny runs: intra-op threads only contend on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _traced(frame) -> bool:
    name = frame.f_code.co_filename
    if not (name.startswith(ENGINE) or name == GRAD_MODE) or frame.f_code in GUARD:
        return False
    return frame.f_back is None or frame.f_back.f_code not in GUARD_ENDS


class Injector:
    """Records the (file, line) events of the engine, or raises KeyboardInterrupt at
    event ``at`` (a trace function that raises is then switched off by Python)."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at
        self.events: list[tuple[str, int]] = []

    def call(self, frame, event, arg):
        return self.line if _traced(frame) else None

    def line(self, frame, event, arg):
        if event == "line":
            if len(self.events) == self.at:
                raise KeyboardInterrupt(f"injected at {frame.f_code.co_filename}:{frame.f_lineno}")
            self.events.append((frame.f_code.co_filename, frame.f_lineno))
        return self.line


# -- the world a command runs in ---------------------------------------------------------


@dataclass
class World:
    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    tm: Session

    def step(self) -> None:
        self.model(torch.randn(2, 3, 6, 6)).sum().backward()
        self.opt.step()
        self.sched.step()


def build() -> World:
    """A tiny CNN whose optimizer has decay / no-decay groups, state and gradients."""
    model, opt, sched = cnn_with_decay_groups()
    world = World(model, opt, sched, Session(model, opt, schedulers=[sched]))
    world.step()
    world.model(torch.randn(2, 3, 6, 6)).sum().backward()  # gradients present
    return world


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[World], object]
    command: Callable[[Session], object]


def _frozen_then_stepped(w: World) -> None:
    w.tm.freeze("block1-2", bn="frozen")
    w.step()


CASES = [
    Case("freeze", lambda w: None, lambda tm: tm.freeze("block1-2", bn="frozen")),
    Case("unfreeze", _frozen_then_stepped, lambda tm: tm.unfreeze("block1", lr=1e-3)),
    Case("replace_head", lambda w: None, lambda tm: tm.replace_head("fc", 5)),
    Case("undo", lambda w: w.tm.freeze("block1-2", bn="frozen"), lambda tm: tm.undo()),
    Case(
        "undo_unfreeze",
        lambda w: (_frozen_then_stepped(w), w.tm.unfreeze("block1", lr=1e-3)),
        lambda tm: tm.undo(),
    ),
    Case("lora", lambda w: None, lambda tm: tm.lora("block1-2", r=2, lr=1e-3)),
    Case(
        "merge_lora",
        lambda w: (w.tm.lora("block1", r=2), w.step()),
        lambda tm: tm.merge_lora(),
    ),
]
# the quick test of the LoRA cases (peft's layers built in every run) is slow
QUICK = [pytest.param(c, marks=pytest.mark.slow) if "lora" in c.name else c for c in CASES]


# -- what must be exactly before or exactly after ---------------------------------------


def _clone(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class Labels:
    """Names for the objects of one run, fixed before the command, so that fresh runs
    compare: a parameter or module by its name then, a param group by its index then."""

    def __init__(self, w: World) -> None:
        self.params = {id(p): n for n, p in w.model.named_parameters()}
        self.modules = {id(m): n for n, m in w.model.named_modules()}
        self.groups = {id(g): i for i, g in enumerate(w.opt.param_groups)}

    def param(self, p: nn.Parameter, where: str = "?") -> str:
        return self.params.get(id(p), f"new {where}")

    def group(self, g: dict, index: int) -> str:
        return str(self.groups.get(id(g), f"new {index}"))


_BN_ATTRIBUTES = ("eps", "momentum", "affine", "track_running_stats", "num_features")


def state(w: World, labels: Labels) -> dict:
    names = {id(p): n for n, p in w.model.named_parameters()}
    homes = REGISTRY.homes.get(w.opt)
    return {
        "params": [
            (n, labels.param(p, n), p.requires_grad, _clone(p), _clone(p.grad))
            for n, p in w.model.named_parameters()
        ],
        "buffers": [(n, _clone(b)) for n, b in w.model.named_buffers()],
        "modules": [
            (
                n,
                type(m).__name__,
                labels.modules.get(id(m), "new"),
                m.training,
                tuple(m._forward_pre_hooks.values()),
                tuple(getattr(m, a, None) for a in _BN_ATTRIBUTES),
            )
            for n, m in w.model.named_modules()
        ],
        "groups": [
            (
                labels.group(g, i),
                tuple(labels.param(p, names.get(id(p), "?")) for p in g["params"]),
                {k: _clone(v) for k, v in g.items() if k != "params"},
            )
            for i, g in enumerate(w.opt.param_groups)
        ],
        "state": {
            labels.param(p, names.get(id(p), "?")): {k: _clone(v) for k, v in s.items()}
            for p, s in w.opt.state.items()
        },
        "homes": sorted(
            (labels.param(p, names.get(id(p), "?")), labels.group(g, -1))
            for p, g in (homes._groups.values() if homes is not None else ())
        ),
        "scheduler": copy.deepcopy(w.sched.state_dict()),  # its lists are live
        "grad_enabled": torch.is_grad_enabled(),
        "sigint": signal.getsignal(signal.SIGINT),
        "current": w.tm.workspace.current,
        "history": [(e.index, e.command, e.live) for e in w.tm.history()],
    }


def _differing(a: dict, b: dict) -> list[str]:
    return [key for key in a if not equal({key: a[key]}, {key: b[key]})]


@dataclass
class Outcome:
    before: dict
    after: dict
    interrupted: bool
    events: list[tuple[str, int]]


def run(case: Case, at: int | None = None) -> Outcome:
    world = build()
    case.setup(world)
    optimizer_sync.homes(world.opt)  # first sight of the groups: recorded, never undone
    labels = Labels(world)
    before = state(world, labels)
    torch.manual_seed(1)  # a new head's initial weights, the same in every run
    injector = Injector(at)
    interrupted = False
    sys.settrace(injector.call)
    try:
        case.command(world.tm)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.settrace(None)
    return Outcome(before, state(world, labels), interrupted, injector.events)


def _points(events: list[tuple[str, int]], every: int, each_line: bool = False) -> list[int]:
    """Where to inject: the first and the last run of each line (of every traced file with
    ``each_line``, else of the files that move state and of the session), and every
    ``every``-th event."""
    ends: dict[tuple[str, int], list[int]] = {}
    for k, event in enumerate(events):
        path = Path(event[0])
        if each_line or path.name in ALWAYS or path.parent.name == "session":
            ends.setdefault(event, [k, k])[1] = k
    return sorted({k for pair in ends.values() for k in pair} | set(range(0, len(events), every)))


def _inject(case: Case, every: int, each_line: bool = False) -> tuple[int, int, int]:
    run(case)  # first sight fills the engine's per-class caches: later runs trace alike
    clean = run(case)
    assert not clean.interrupted
    assert clean.events, "nothing traced"
    assert len(clean.after["history"]) != len(clean.before["history"])
    assert not equal(clean.before, clean.after)
    counts = {"before": 0, "after": 0}
    points = _points(clean.events, every, each_line)
    for k in points:
        hit = run(case, at=k)
        where = clean.events[k]
        assert hit.interrupted, f"interrupt at {where} was swallowed"
        assert equal(hit.before, clean.before), "runs differ before the command"
        if equal(hit.after, hit.before):
            counts["before"] += 1
        elif equal(hit.after, clean.after):
            counts["after"] += 1
        else:
            pytest.fail(
                f"{case.name}: interrupt at {where} (event {k}) left neither the state "
                f"before nor after; differs from before in {_differing(hit.after, hit.before)}, "
                f"from after in {_differing(hit.after, clean.after)}"
            )
    return len(points), counts["before"], counts["after"]


@pytest.mark.parametrize("case", QUICK, ids=[c.name for c in CASES])
def test_interrupt_at_any_line_leaves_before_or_after(case):
    total, before, after = _inject(case, every=50)
    assert before and after  # both outcomes are reached: the injection reaches the commit


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_interrupt_at_every_line_leaves_before_or_after(case):
    """Every line the command runs, at its first and its last run (a loop's middle
    iterations repeat its first: every tenth event samples them)."""
    total, before, after = _inject(case, every=10, each_line=True)
    assert before + after == total


# -- the guard itself --------------------------------------------------------------------


def test_sigint_is_held_until_the_block_ends_then_raised():
    # Python's own handler, whatever an earlier test or library left installed
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        reached_end = False
        with pytest.raises(KeyboardInterrupt):
            with Uninterrupted():
                os.kill(os.getpid(), signal.SIGINT)
                reached_end = True
        assert reached_end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


def test_guard_restores_grad_mode_and_does_nothing_off_the_main_thread():
    with Uninterrupted():
        torch.set_grad_enabled(False)  # as an interrupted torch.no_grad() exit leaves it
    assert torch.is_grad_enabled()
    seen: list[object] = []

    def worker() -> None:
        with Uninterrupted():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGINT)]


def test_revert_finishes_when_interrupted_part_way():
    tx = Transaction()
    done: list[int] = []
    interrupted = [False]

    def flaky() -> None:
        if not interrupted[0]:
            interrupted[0] = True
            raise KeyboardInterrupt
        done.append(2)

    tx.add(lambda: done.append(1))
    tx.add(flaky)
    tx.add(lambda: done.append(3))
    with pytest.raises(KeyboardInterrupt):
        tx.revert()
    assert done == [3, 2, 1]


# -- the magics say when the change was applied ------------------------------------------


def test_magic_interrupted_while_rendering_says_it_was_applied(ip, request):
    world = build()
    ip.user_ns.update(model=world.model, optimizer=world.opt)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    render.render.register(Change, interrupted)  # drawing the change is interrupted
    request.addfinalizer(lambda: render.render.register(Change, render.change))
    with capture_output() as cap, pytest.raises(KeyboardInterrupt):
        ip.run_line_magic("freeze", "block1")
    assert "interrupted after %freeze block1 was applied" in cap.outputs[0].data["text/plain"]
    assert not any(p.requires_grad for p in world.model.block1.parameters())
    assert [e.command for e in loaded(ip).session.history()] == ["%freeze block1"]
    with capture_output() as cap, pytest.raises(KeyboardInterrupt):
        ip.run_line_magic("freeze", "--dry-run block2")
    assert not cap.outputs  # nothing was applied, so nothing to say
