"""Surgery latency: torchmagic's engine and magics against hand-written PyTorch and peers.

Not a test. Run from the repository root::

    .venv/bin/python bench/surgery.py [--models resnet50,vit_l_16,maxvit_t] [--repeat N]
        [--blocks 10000] [--blocks-repeat 5]

Per model (torchvision, ``weights=None``, built once, AdamW over all parameters) it prints
the MEDIAN latency, inter-quartile range, minimum and median CPU time (ms) of:

* engine calls (``Session.freeze/unfreeze/replace_head/summary/undo``), each mutating call
  undone outside the timed region so every repetition starts from the same state;
* the same as whole line magics in an ``InteractiveShell``, including rendering: IPython's
  display formatter calls ``_repr_mimebundle_`` (text/plain + text/html) inside the timed
  region, which is verified by counting the calls and checking the captured bundle;
* the rich rendering alone (``_repr_mimebundle_`` of an already computed result);
* the hand-written PyTorch freeze (requires_grad off + param groups rebuilt without the
  frozen tensors) as the baseline, and peers where installed: Lightning's
  ``BaseFinetuning.freeze``, ``timm.utils.model.freeze`` and ``torchinfo.summary``.

Then a table for an ``nn.Sequential`` of 10,000 ``Linear(8, 8)`` blocks (SGD): freeze and
unfreeze of 5,000 of them, everything but the last, a geometric lr spread over all 10,000
(10,000 new param groups), undo and summary, engine and whole magic, each with the Python
calls it makes per block (counted untimed: work that does not depend on the load).

Targets (PASS/FAIL): engine freeze/unfreeze/replace_head < 5 ms on maxvit_t; every whole
magic < 50 ms; our summary of maxvit_t faster than ``torchinfo.summary(model)`` without
input; freeze / unfreeze of 5,000 of 10,000 blocks < 1 s, engine and magic. ``--profile``
runs cProfile over every failing row of the model tables and prints where time goes.

Targets judge the wall-clock median (``time.perf_counter``). On a shared machine other
processes preempt long calls (the load average is printed): ``min`` shows the floor and
``cpu ms`` (``time.thread_time`` of the calling thread) the work itself.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from machine import describe
from torchvision import models

from torchmagic import Session, render

ENGINE_TARGET_MS = 5.0
MAGIC_TARGET_MS = 50.0
BLOCKS_TARGET_MS = 1000.0  # freeze / unfreeze of 5,000 of 10,000 blocks
ENGINE_TARGET_MODEL = "maxvit_t"
SUMMARY_TARGET_MODEL = "maxvit_t"
VERDICTS = {True: "PASS", False: "FAIL", None: "SKIP"}


@dataclass(frozen=True)
class Spec:
    """What each model's benchmark freezes and unfreezes."""

    freeze: tuple[str, ...]  # qualified module names, for the hand-written code and peers
    freeze_target: str  # the same in torchmagic's grammar
    stage: tuple[str, ...]  # the next stage, unfrozen with lr=1e-4
    stage_target: str


def _layers(first: int, last: int) -> tuple[str, ...]:
    return tuple(f"encoder.layers.encoder_layer_{i}" for i in range(first, last + 1))


SPECS = {
    "resnet50": Spec(("layer1", "layer2", "layer3"), "layer1-3", ("layer4",), "layer4"),
    "vit_l_16": Spec(
        _layers(0, 11),
        "encoder.layers.encoder_layer_0-11",
        _layers(12, 23),
        "encoder.layers.encoder_layer_12-23",
    ),
    "maxvit_t": Spec(("blocks.0", "blocks.1", "blocks.2"), "blocks.0-2", ("blocks.3",), "blocks.3"),
}


# -- timing ------------------------------------------------------------------------------


@dataclass
class Stat:
    samples: list[float]  # wall clock (perf_counter), ms: what the targets judge
    cpu: list[float]  # CPU time of the calling thread (thread_time), ms: immune to preemption

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def iqr(self) -> float:
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q3 - q1


def measure(
    call: Callable[[], object],
    reset: Callable[[object], None] | None,
    *,
    repeat: int,
    warmup: int,
) -> Stat:
    """Median-ready samples (ms) of ``call``; ``reset(result)`` runs untimed after each.

    The garbage collector is off inside the timed region only (as in ``timeit``).
    """
    samples, cpu = [], []
    for i in range(warmup + repeat):
        gc.disable()
        try:
            start, cpu_start = time.perf_counter(), time.thread_time()
            result = call()
            elapsed, cpu_elapsed = time.perf_counter() - start, time.thread_time() - cpu_start
        finally:
            gc.enable()
        if reset is not None:
            reset(result)
        if i >= warmup:
            samples.append(elapsed * 1e3)
            cpu.append(cpu_elapsed * 1e3)
    return Stat(samples, cpu)


# -- the rows of one table ---------------------------------------------------------------


@dataclass(frozen=True)
class Profiled:
    """What ``--profile`` runs for a row: ``call`` profiled, ``reset(result)`` not; ``before``
    and ``after`` bracket the loop when the row needs a state set up (``%tm undo``)."""

    call: Callable[[], object]
    reset: Callable[[object], None] | None = None
    before: Callable[[], object] | None = None
    after: Callable[[], object] | None = None


@dataclass
class Row:
    group: str
    label: str
    stat: Stat | None = None  # None: peer not installed
    ratio: str = ""
    target: float | None = None  # ms; a row-level target
    note: str = ""
    profile: Profiled | None = field(default=None, repr=False)

    @property
    def verdict(self) -> str:
        if self.target is None or self.stat is None:
            return ""
        return "PASS" if self.stat.median < self.target else "FAIL"


@dataclass
class Check:
    text: str
    ok: bool | None  # None: could not be checked (a peer is not installed)


# -- counting the renders IPython performs ------------------------------------------------

RENDERS = {"bundles": 0}
_original_bundle = render.Rendered._repr_mimebundle_


def _counting_bundle(self, include=None, exclude=None):
    RENDERS["bundles"] += 1
    return _original_bundle(self, include=include, exclude=exclude)


render.Rendered._repr_mimebundle_ = _counting_bundle


def magic_call(ip, magic_name: str, line: str) -> Callable[[], None]:
    """A call of the whole line magic that checks IPython drew exactly one bundle."""

    def call() -> None:
        before = RENDERS["bundles"]
        ip.run_line_magic(magic_name, line)
        drawn = RENDERS["bundles"] - before
        if drawn != 1:
            raise AssertionError(f"%{magic_name} {line}: {drawn} bundles drawn, not 1")

    return call


def count_calls(action: Callable[[], object]) -> int:
    """Python and C function calls ``action()`` makes: work that does not depend on the
    machine's load (``sys.setprofile``; run untimed)."""
    counts = {"call": 0, "c_call": 0}

    def tally(frame, event, arg) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(tally)
    try:
        action()
    finally:
        sys.setprofile(None)
    return counts["call"] + counts["c_call"]


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "torchmagic")
    return ip


# -- hand-written baseline and peers ------------------------------------------------------


def hand_freeze(model: torch.nn.Module, optimizer: torch.optim.Optimizer, names) -> None:
    """The minimal honest hand-written freeze: requires_grad off and the optimizer's
    groups rebuilt without the frozen tensors (no undo, no BatchNorm policy, no report)."""
    params = [p for name in names for p in model.get_submodule(name).parameters()]
    frozen = {id(p) for p in params}
    for p in params:
        p.requires_grad_(False)
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in frozen]


def _snapshot(model, optimizer):
    flags = [(p, p.requires_grad) for p in model.parameters()]
    groups = [list(g["params"]) for g in optimizer.param_groups]

    def restore(_=None) -> None:
        for p, flag in flags:
            p.requires_grad_(flag)
        for g, params in zip(optimizer.param_groups, groups, strict=True):
            g["params"] = list(params)

    return restore


def _state_key(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    """Everything a benchmarked command changes; equal keys = the same starting state."""
    return (
        tuple((id(p), p.requires_grad) for p in model.parameters()),
        tuple((id(m), m.training, len(m._forward_pre_hooks)) for m in model.modules()),
        tuple((tuple(id(p) for p in g["params"]), g["lr"]) for g in optimizer.param_groups),
    )


def _lightning():
    try:
        from lightning.pytorch.callbacks import BaseFinetuning
    except ImportError:
        try:
            from pytorch_lightning.callbacks import BaseFinetuning
        except ImportError:
            return None
    return BaseFinetuning


def _timm_freeze():
    try:
        from timm.utils.model import freeze, unfreeze
    except ImportError:
        return None
    return freeze, unfreeze


def _torchinfo():
    try:
        import torchinfo
    except ImportError:
        return None
    return torchinfo.summary


# -- one model ----------------------------------------------------------------------------


def bench_model(
    name: str, ip, repeat: int, warmup: int, profile_failures: bool
) -> tuple[list[Check], list[str]]:
    """Print one model's table; return its checks and (with ``profile_failures``) the
    cProfile reports of the rows that missed their targets."""
    spec = SPECS[name]
    start = time.perf_counter()
    torch.manual_seed(0)
    model = getattr(models, name)(weights=None)
    build_s = time.perf_counter() - start
    for qualified in (*spec.freeze, *spec.stage):
        model.get_submodule(qualified)  # the child names really exist
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n## {name}: {n_params / 1e6:.1f}M params, {sum(1 for _ in model.modules())} "
          f"modules, {sum(1 for _ in model.parameters())} tensors (built in {build_s:.1f} s)",
          flush=True)
    kw = {"repeat": repeat, "warmup": warmup}
    start_state = _state_key(model, optimizer)
    rows: list[Row] = []
    checks: list[Check] = []
    profiles: list[str] = []
    gated = name == ENGINE_TARGET_MODEL

    def engine_target() -> float | None:
        return ENGINE_TARGET_MS if gated else None

    # engine ------------------------------------------------------------------------------
    s = Session(model, optimizer)
    undo = lambda _=None: s.undo()  # noqa: E731

    def freeze():
        return s.freeze(spec.freeze_target)

    def unfreeze():
        return s.unfreeze(spec.stage_target, lr=1e-4)

    def replace_head():
        return s.replace_head("auto", 10)

    def summary():
        return s.summary(depth=2)

    def freeze_stage():
        return s.freeze(spec.stage_target)

    e_freeze = Row("engine", f'freeze("{spec.freeze_target}")', measure(freeze, undo, **kw),
                   target=engine_target(), profile=Profiled(freeze, undo))
    e_undo = Row("engine", "undo() of that freeze", _time_undo(s, freeze, **kw))
    freeze_stage()  # unfreeze starts from a frozen next stage
    e_unfreeze = Row("engine", f'unfreeze("{spec.stage_target}", lr=1e-4)',
                     measure(unfreeze, undo, **kw), target=engine_target(),
                     note="from a frozen stage",
                     profile=Profiled(unfreeze, undo, freeze_stage, undo))
    s.undo()
    e_head = Row("engine", 'replace_head("auto", 10)', measure(replace_head, undo, **kw),
                 target=engine_target(), profile=Profiled(replace_head, undo))
    e_summary = Row("engine", "summary(depth=2)", measure(summary, None, **kw),
                    profile=Profiled(summary))
    rows += [e_freeze, e_undo, e_unfreeze, e_head, e_summary]
    assert _state_key(model, optimizer) == start_state, "engine rows did not undo cleanly"

    # rendering alone --------------------------------------------------------------------
    change = s.freeze(spec.freeze_target)
    s.undo()
    report = s.summary(depth=2)
    rows.append(Row("render", "render.change -> bundle", measure(
        lambda: render.change(change)._repr_mimebundle_(), None, **kw)))
    rows.append(Row("render", "render.summary -> bundle", measure(
        lambda: render.summary(report)._repr_mimebundle_(), None, **kw)))
    for drawn in (render.change(change), render.summary(report)):
        bundle = drawn._repr_mimebundle_()
        assert set(bundle) == {"text/plain", "text/html"}, bundle.keys()

    # whole magics -----------------------------------------------------------------------
    from IPython.utils.capture import capture_output

    ip.user_ns["model"], ip.user_ns["optimizer"] = model, optimizer
    magic_rows = []
    with capture_output() as captured:

        def magic(magic_name: str, line: str):
            return magic_call(ip, magic_name, line)

        def magic_undo(_=None) -> None:
            ip.run_line_magic("tm", "undo")

        def magic_row(
            magic_name: str, line: str, undo_after: bool, note: str = "", setup=None, teardown=None
        ) -> Row:
            call = magic(magic_name, line)
            reset = magic_undo if undo_after else None
            stat = measure(call, reset, **kw)
            shown = f"%{magic_name} {line}".strip()
            return Row("magic", shown, stat, target=MAGIC_TARGET_MS, note=note,
                       profile=Profiled(call, reset, setup, teardown))

        bundles_before = RENDERS["bundles"]
        magic_rows.append(magic_row("freeze", f"model.{spec.freeze_target}", True))
        ip.run_line_magic("freeze", f"model.{spec.freeze_target}")
        refreeze = lambda _=None: ip.run_line_magic(  # noqa: E731
            "freeze", f"model.{spec.freeze_target}")
        undo_stat = measure(magic("tm", "undo"), refreeze, **kw)
        ip.run_line_magic("tm", "undo")
        magic_rows.append(Row("magic", "%tm undo (of that freeze)", undo_stat,
                              target=MAGIC_TARGET_MS, profile=Profiled(
                                  magic("tm", "undo"), refreeze, refreeze, magic_undo)))
        magic_freeze_stage = lambda: ip.run_line_magic(  # noqa: E731
            "freeze", f"model.{spec.stage_target}")
        magic_freeze_stage()
        magic_rows.append(magic_row("unfreeze", f"model.{spec.stage_target} lr=1e-4", True,
                                    "from a frozen stage", magic_freeze_stage, magic_undo))
        ip.run_line_magic("tm", "undo")
        magic_rows.append(magic_row("replace_head", "auto 10", True))
        magic_rows.append(magic_row("summary", "", False))
        bundles = RENDERS["bundles"] - bundles_before
        # profiled here, while the model is bound and before any peer alters it
        for row in (e_freeze, e_unfreeze, e_head, *magic_rows):
            if profile_failures and row.verdict == "FAIL" and row.profile is not None:
                profiles.append(profile(_check_text(name, row), row.profile, repeat))
    html = [o for o in captured.outputs if "text/html" in o.data and "text/plain" in o.data]
    if len(html) != len(captured.outputs) or bundles < len(magic_rows) * (warmup + repeat):
        raise AssertionError("the magics did not render a text/plain + text/html bundle each")
    rows += magic_rows
    assert _state_key(model, optimizer) == start_state, "magic rows did not undo cleanly"
    del ip.user_ns["model"], ip.user_ns["optimizer"]
    counts = f"{bundles} bundles drawn by IPython's formatter, {len(html)} outputs captured"

    # baseline and peers -----------------------------------------------------------------
    restore = _snapshot(model, optimizer)
    hand = Row("baseline", "hand-written freeze", measure(
        lambda: hand_freeze(model, optimizer, spec.freeze), restore, **kw), ratio="1.0x (ref)",
        note="requires_grad + groups")
    rows.append(hand)
    ref = hand.stat.median

    def vs_hand(row: Row) -> None:
        if row.stat is not None:
            row.ratio = f"{row.stat.median / ref:.1f}x hand"

    for row in (e_freeze, magic_rows[0]):
        vs_hand(row)

    fine = _lightning()
    if fine is None:
        rows.append(Row("peer", "Lightning BaseFinetuning.freeze", note="not installed"))
    else:
        modules = [model.get_submodule(n) for n in spec.freeze]
        row = Row("peer", "Lightning BaseFinetuning.freeze", measure(
            lambda: fine.freeze([model.get_submodule(n) for n in spec.freeze], train_bn=False),
            lambda _: fine.make_trainable(modules), **kw), note="train_bn=False; no optimizer")
        vs_hand(row)
        rows.append(row)

    info = _torchinfo()
    if info is None:
        rows.append(Row("peer", "torchinfo.summary(model)", note="not installed"))
        if name == SUMMARY_TARGET_MODEL:
            checks.append(Check(f"{name}: summary vs torchinfo.summary: not installed", None))
    else:
        row = Row("peer", "torchinfo.summary(model, verbose=0)", measure(
            lambda: info(model, verbose=0), None, **kw), ratio="1.0x (ref)",
            note="no input: no forward")
        rows.append(row)
        e_summary.ratio = f"{e_summary.stat.median / row.stat.median:.2f}x torchinfo"
        if name == SUMMARY_TARGET_MODEL:
            ok = e_summary.stat.median < row.stat.median
            text = (f"{name}: summary(depth=2) {e_summary.stat.median:.2f} ms "
                    f"< torchinfo.summary {row.stat.median:.2f} ms")
            checks.append(Check(text, ok))
            if profile_failures and not ok:
                profiles.append(profile(text, e_summary.profile, repeat))

    timm = _timm_freeze()  # last: it swaps BatchNorm2d modules, so the model is left altered
    if timm is None:
        rows.append(Row("peer", "timm.utils.model.freeze", note="not installed"))
    else:
        t_freeze, t_unfreeze = timm
        row = Row("peer", "timm.utils.model.freeze", measure(
            lambda: t_freeze(model, list(spec.freeze)),
            lambda _: t_unfreeze(model, list(spec.freeze)), **kw),
            note="BN2d -> FrozenBN2d; no optimizer")
        vs_hand(row)
        rows.append(row)

    checks += [Check(_check_text(name, r), r.verdict == "PASS") for r in rows if r.verdict]
    print_table(name, rows)
    print(f"  ({counts}; {repeat} timed runs after {warmup} warm-up runs per row)")
    return checks, profiles


# -- thousands of small blocks ------------------------------------------------------------


def bench_blocks(ip, n: int, repeat: int, warmup: int) -> list[Check]:
    """Print the table of ``nn.Sequential`` of ``n`` ``Linear(8, 8)`` blocks under SGD:
    freeze / unfreeze of half of them (target < BLOCKS_TARGET_MS, engine and whole magic),
    everything but the last, a geometric lr spread over every block (``n`` new param
    groups), undo and summary; each with the Python calls it makes (per block), which do
    not depend on the load."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(n)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    half, every, last = f"0-{n // 2 - 1}", f"0-{n - 1}", str(n - 1)
    print(f"\n## {n} blocks: nn.Sequential of {n} Linear(8, 8), SGD "
          f"({n + 1} modules, {2 * n} tensors)", flush=True)
    kw = {"repeat": repeat, "warmup": warmup}
    start_state = _state_key(model, optimizer)
    s = Session(model, optimizer)
    undo = lambda _=None: s.undo()  # noqa: E731
    calls: dict[str, int] = {}

    def row(group, label, call, reset, target=None, note="", setup=None, teardown=None) -> Row:
        if setup is not None:
            setup()
        calls[label] = count_calls(call)
        if reset is not None:
            reset(None)
        stat = measure(call, reset, **kw)
        if teardown is not None:
            teardown()
        return Row(group, label, stat, target=target, note=note)

    frozen_half = lambda: s.freeze(half)  # noqa: E731
    frozen_but_last = lambda: s.freeze("model", exclude=[last])  # noqa: E731
    rows = [
        row("engine", f'freeze("{half}")', frozen_half, undo, BLOCKS_TARGET_MS),
        row("engine", f'unfreeze("{half}")', lambda: s.unfreeze(half), undo, BLOCKS_TARGET_MS,
            "from that freeze", frozen_half, s.undo),
        row("engine", f'freeze(exclude=["{last}"])', frozen_but_last, undo),
        row("engine", f'unfreeze("{every}", lr=(1e-5, 1e-3))',
            lambda: s.unfreeze(every, lr=(1e-5, 1e-3)), undo, note=f"{n} new groups"),
        row("engine", f'same, after freeze(exclude=["{last}"])',
            lambda: s.unfreeze(every, lr=(1e-5, 1e-3)), undo, note=f"{n} new groups",
            setup=frozen_but_last, teardown=s.undo),
        row("engine", f'undo() of freeze("{half}")', undo, lambda _: frozen_half(),
            setup=frozen_half, teardown=s.undo),
        row("engine", "summary()", lambda: s.summary(), None),
    ]
    assert _state_key(model, optimizer) == start_state, "engine rows did not undo cleanly"
    from IPython.utils.capture import capture_output

    ip.user_ns["model"], ip.user_ns["optimizer"] = model, optimizer
    magic_undo = lambda _=None: ip.run_line_magic("tm", "undo")  # noqa: E731
    magic_half = lambda: ip.run_line_magic("freeze", half)  # noqa: E731
    with capture_output():
        rows += [
            row("magic", f"%freeze {half}", magic_call(ip, "freeze", half), magic_undo,
                BLOCKS_TARGET_MS),
            row("magic", f"%unfreeze {half}", magic_call(ip, "unfreeze", half), magic_undo,
                BLOCKS_TARGET_MS, "from that freeze", magic_half, magic_undo),
            row("magic", f"%freeze model --except {last}",
                magic_call(ip, "freeze", f"model --except {last}"), magic_undo),
            row("magic", f"%unfreeze {every} lr=1e-5:1e-3",
                magic_call(ip, "unfreeze", f"{every} lr=1e-5:1e-3"), magic_undo,
                note=f"{n} new groups; table shows 20"),
            row("magic", "%tm undo (of that freeze)", magic_call(ip, "tm", "undo"),
                lambda _: magic_half(), setup=magic_half, teardown=magic_undo),
            row("magic", "%summary", magic_call(ip, "summary", ""), None),
        ]
    del ip.user_ns["model"], ip.user_ns["optimizer"]
    assert _state_key(model, optimizer) == start_state, "magic rows did not undo cleanly"
    restore = _snapshot(model, optimizer)
    names = [str(i) for i in range(n // 2)]
    hand = Row("baseline", "hand-written freeze of that half", measure(
        lambda: hand_freeze(model, optimizer, names), restore, **kw), ratio="1.0x (ref)",
        note="requires_grad + groups")
    for r in rows:
        r.ratio = f"{r.stat.median / hand.stat.median:.1f}x hand"
        r.note = "; ".join(x for x in (f"{calls[r.label] / n:.0f} calls/block", r.note) if x)
    rows.append(hand)
    print_table(f"{n} blocks", rows)
    print(f"  (calls: Python + C function calls of one run, counted untimed; "
          f"{repeat} timed runs after {warmup} warm-up runs per row)")
    return [Check(_check_text(f"{n} blocks", r), r.verdict == "PASS") for r in rows if r.verdict]


def _check_text(name: str, row: Row) -> str:
    return f"{name}: {row.group} {row.label} {row.stat.median:.2f} ms < {row.target:g} ms"


def _time_undo(s: Session, freeze: Callable[[], object], *, repeat: int, warmup: int) -> Stat:
    """undo() timed alone: each repetition re-applies the freeze untimed first."""
    freeze()
    stat = measure(lambda: s.undo(), lambda _: freeze(), repeat=repeat, warmup=warmup)
    s.undo()
    return stat


# -- output -------------------------------------------------------------------------------


def print_table(name: str, rows: list[Row]) -> None:
    header = ("kind", "operation", "median ms", "IQR ms", "min ms", "cpu ms", "ratio", "target",
              "check", "note")
    lines = []
    for r in rows:
        if r.stat is None:
            lines.append((r.group, r.label, "-", "-", "-", "-", "", "", "", r.note))
            continue
        target = f"< {r.target:g} ms" if r.target is not None else ""
        lines.append((r.group, r.label, f"{r.stat.median:.2f}", f"{r.stat.iqr:.2f}",
                      f"{r.stat.min:.2f}", f"{r.stat.cpu_median:.2f}", r.ratio, target,
                      r.verdict, r.note))
    widths = [max(len(str(x[i])) for x in (header, *lines)) for i in range(len(header))]
    right = {2, 3, 4, 5}

    def fmt(cells) -> str:
        out = [str(c).rjust(w) if i in right else str(c).ljust(w)
               for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    print(fmt(header))
    print(fmt(["-" * w for w in widths]))
    for line in lines:
        print(fmt(line))


def profile(title: str, profiled: Profiled, repeat: int) -> str:
    """cProfile of ``repeat`` calls (resets not profiled): torchmagic's functions by
    cumulative time, then the top functions overall by own time."""
    from IPython.utils.capture import capture_output

    profiler = cProfile.Profile()
    with capture_output():
        if profiled.before is not None:
            profiled.before()
        for _ in range(repeat):
            profiler.enable()
            result = profiled.call()
            profiler.disable()
            if profiled.reset is not None:
                profiled.reset(result)
        if profiled.after is not None:
            profiled.after()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"torchmagic", 18)
    stats.sort_stats("tottime").print_stats(12)
    keep = [line for line in out.getvalue().splitlines()
            if line.strip() and "Ordered by" not in line]
    return "\n".join([f"\n### cProfile of {repeat} calls (resets not profiled): {title}", *keep])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,vit_l_16,maxvit_t",
                        help="comma-separated torchvision model names among: " + ", ".join(SPECS))
    parser.add_argument("--repeat", type=int, default=31, help="timed runs per row (>= 15)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before timing")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile every row that misses its target")
    parser.add_argument("--blocks", type=int, default=10_000,
                        help="blocks of the Sequential of Linear(8, 8) (0: skip that table)")
    parser.add_argument("--blocks-repeat", type=int, default=5,
                        help="timed runs per row of the blocks table (>= 3)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}; choose from {', '.join(SPECS)}")
    if args.repeat < 15:
        parser.error("--repeat must be >= 15")
    if args.blocks_repeat < 3:
        parser.error("--blocks-repeat must be >= 3")

    print("# torchmagic surgery latency (bench/surgery.py)")
    print(describe())
    if hasattr(os, "getloadavg"):
        print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    peers = {"lightning": _lightning(), "timm": _timm_freeze(), "torchinfo": _torchinfo()}
    print("peers: " + ", ".join(f"{k} {'installed' if v else 'not installed'}"
                               for k, v in peers.items()))
    start = time.perf_counter()
    ip = _shell()
    checks: list[Check] = []
    profiles: list[str] = []
    for name in names:
        model_checks, model_profiles = bench_model(
            name, ip, args.repeat, args.warmup, args.profile
        )
        checks += model_checks
        profiles += model_profiles
        gc.collect()
    if args.blocks:
        checks += bench_blocks(ip, args.blocks, args.blocks_repeat, 1)

    print("\n## targets")
    for check in checks:
        print(f"{VERDICTS[check.ok]}  {check.text}")
    failed = [c for c in checks if c.ok is False]
    checks = [c for c in checks if c.ok is not None]
    load = ""
    if hasattr(os, "getloadavg"):
        load = "; load average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{len(checks) - len(failed)}/{len(checks)} targets met; "
          f"total {time.perf_counter() - start:.0f} s{load}")
    for text in profiles:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
