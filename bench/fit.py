"""Training throughput: torchmagic's ``%fit`` against a hand-written PyTorch loop.

Not a test. Run from the repository root::

    .venv/bin/python bench/fit.py [--quick] [--repeat N] [--epochs N] [--threads N] [--profile]

Data: scikit-learn's digits (``load_digits``, shipped with the package: no download),
upsampled bilinearly to 32 or 64 px, normalised, repeated to 3 channels, split 80/20
(stratified, seed 0). Model: torchvision ``resnet18(weights=None, num_classes=10)``
(``resnet50`` for the GPU section). Batch 64, SGD with momentum 0.9.

1. **Throughput** (32 px, full fine-tuning, nothing frozen): samples/s of timed runs of the
   hand-written loop (``x.to(device)``, forward, ``F.cross_entropy``, ``zero_grad``,
   ``backward``, ``step``), of ``Session.fit`` (the engine ``%fit`` calls) and of the whole
   ``%fit`` line magic run as a cell in an IPython ``InteractiveShell`` with its live
   progress observer (``NotebookProgress``, redrawn every 0.5 s) and the final history view
   (chart included) drawn by IPython's display formatter; display output is captured.
   The variants alternate (order rotated each repeat) on the same model, optimizer,
   DataLoader and batch size; after untimed warm-up steps each variant makes ``--repeat``
   timed runs (default 5) of ``--epochs`` epochs in one call (default 2). Target: median
   samples/s of ``%fit`` (engine and whole magic) >= 0.97 x the hand-written loop, judged
   on whole runs (as specified) and on per-step medians. The magic's final history view
   (table + matplotlib chart) is a fixed cost per call: a row shows the magic without it.
1b. **Accumulation and clipping** (32 px, as in 1): ``Session.fit(accumulate=4, clip=1.0)``
   against the hand-written accumulating loop (loss / 4, backward; every 4 batches and at
   the epoch's last: ``clip_grad_norm_``, step, ``zero_grad``), alternated, one epoch per
   run. Target: median samples/s >= 0.97 x the hand loop (whole runs and per step).
2. **--cache-features** (64 px): 10 head-only epochs (``freeze(exclude=["fc"])``, BN policy
   eval) with validation, end to end, cached (first feature pass included; 3 runs) against
   uncached (1 run), same initial weights, seed and data. Targets: speed-up >= 5x; final
   test accuracies within 1 point. Also reported: the max abs difference of the final heads.
3. **%amp bf16 on the CPU**: per-step time of the resnet18 training step (32 px, via
   ``Session.fit(max_steps=...)``) under bf16 autocast against fp32. No target.
4. **GPU** (only when ``torch.cuda.is_available()``): resnet50 at 64 px for a few hundred
   steps in fp32, fp16 + GradScaler and bf16; checks that the loss stays finite and
   decreases, and reports samples/s against fp32.
5. **GPU throughput** (only with CUDA): resnet50 at 128 px, batch 64, bf16 autocast, SGD
   momentum, batches already on the GPU, 150 steps per run, median of 3 alternated runs
   of each variant: a hand loop with no host sync (no ``loss.item()``: the bar),
   ``Session.fit`` and the whole ``%fit`` magic (live progress and final view included).
   Targets: ``Session.fit`` >= 0.98x and ``%fit`` >= 0.97x the hand loop's samples/s.

The machine may be shared: the load average is printed, timings show median and min, and
the ratio rows also give the median of per-repeat paired ratios, best against best, the
ratio of process CPU time (``time.process_time``, all threads) and per-step medians (an
optimizer step post-hook timestamps every step of every variant alike).

Threads: torch runs ONE intra-op thread by default here (``--threads 1``). On the shared
2-core machine this was written on (load average 4-6 from other processes), two OpenMP
threads made a resnet18 epoch 8-18x slower than one thread, and erratic (a preempted
thread stalls every parallel region of the other), which no 3 % ratio survives; with one
thread a step is stable. ``--threads 2`` uses both cores on an idle machine.
``--quick`` is a smoke run on a few hundred samples: its verdicts are indicative only.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import datetime
import gc
import io
import math
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from machine import describe
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18, resnet50

from torchmagic import Session, notebook_session, render
from torchmagic.core.training.fit_events import StopReason

BATCH = 64
ACCUMULATE, CLIP = 4, 1.0
LR = 0.01
HEAD_LR = 0.05
CACHE_EPOCHS = 10
RATIO_TARGET = 0.97
SPEEDUP_TARGET = 5.0
ACCURACY_POINTS = 1.0
GPU_STEPS = 300
GPU_RUN_STEPS = 150
GPU_ENGINE_TARGET = 0.98
GPU_MAGIC_TARGET = 0.97
VERDICTS = {True: "PASS", False: "FAIL", None: "SKIP"}


# -- data --------------------------------------------------------------------------------


def digits(px: int, train_size: int | None = None, test_size: int | None = None):
    """(train, test) TensorDatasets of digits at ``px`` x ``px``, 3 channels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(px, px), mode="bilinear", align_corners=False)
    x = ((x - x.mean()) / x.std()).expand(-1, 3, -1, -1).contiguous()
    y = torch.tensor(data.target, dtype=torch.int64)
    train, test = train_test_split(
        list(range(len(y))), test_size=0.2, stratify=data.target, random_state=0
    )
    train, test = torch.tensor(train[:train_size]), torch.tensor(test[:test_size])
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def loader(dataset: TensorDataset, shuffle: bool, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(dataset, batch_size=BATCH, shuffle=shuffle, generator=generator)


# -- timing and reporting ----------------------------------------------------------------


@dataclass
class Timed:
    wall: float  # s, perf_counter
    cpu: float  # s, process_time: every thread of this process
    samples: int
    result: object = None
    steps: list[float] = field(default_factory=list)  # s between optimizer steps

    @property
    def rate(self) -> float:
        return self.samples / self.wall


class StepClock:
    """Timestamps every ``optimizer.step()`` (a step post-hook: the same instrument for
    every variant), so per-step intervals can be taken inside one timed call."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.times: list[float] = []
        self.handle = optimizer.register_step_post_hook(self._hook)

    def _hook(self, optimizer, args, kwargs) -> None:
        self.times.append(time.perf_counter())

    def intervals(self, start: float) -> list[float]:
        times = [start, *self.times]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def timed(call: Callable[[], tuple[int, object]], clock: StepClock | None = None) -> Timed:
    gc.collect()
    if clock is not None:
        clock.times.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    samples, result = call()
    done = Timed(time.perf_counter() - wall, time.process_time() - cpu, samples, result)
    if clock is not None:
        done.steps = clock.intervals(wall)
    return done


@dataclass
class Row:
    measurement: str
    median: str = ""
    min: str = ""
    unit: str = ""
    ratio: str = ""
    target: str = ""
    check: bool | None = None
    note: str = ""

    @property
    def verdict(self) -> str:
        return "" if self.check is None and not self.target else VERDICTS[self.check]


@dataclass
class Section:
    title: str
    rows: list[Row] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # printed under the table

    def print(self) -> None:
        print(f"\n## {self.title}")
        if self.rows:
            header = ("measurement", "median", "min", "unit", "ratio", "target", "check", "note")
            cells = [header] + [
                (r.measurement, r.median, r.min, r.unit, r.ratio, r.target, r.verdict, r.note)
                for r in self.rows
            ]
            widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
            right = {1, 2}

            def fmt(row) -> str:
                return "  ".join(
                    c.rjust(w) if i in right else c.ljust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                ).rstrip()

            print(fmt(header))
            print("  ".join("-" * w for w in widths))
            for row in cells[1:]:
                print(fmt(row))
        for line in self.lines:
            print(f"  {line}")


@dataclass
class Check:
    text: str
    ok: bool | None


def _median_min(values: list[float], digits: int = 2) -> tuple[str, str]:
    return f"{statistics.median(values):.{digits}f}", f"{min(values):.{digits}f}"


# -- 1. throughput -----------------------------------------------------------------------


def hand_epoch(model: nn.Module, optimizer, batches, device: torch.device) -> int:
    """The hand-written loop the brief compares against (plus ``model.train()``)."""
    model.train()
    seen = 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(y)
    return seen


class _Probe:
    """Wraps a render method to count its calls and add up the wall time spent in it."""

    def __init__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner, name
        self.original = getattr(owner, name)
        self.calls, self.seconds = 0, 0.0
        probe = self

        def wrapper(self_, *args, **kwargs):
            start = time.perf_counter()
            try:
                return probe.original(self_, *args, **kwargs)
            finally:
                probe.seconds += time.perf_counter() - start
                probe.calls += 1

        setattr(owner, name, wrapper)

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def restore(self) -> None:
        setattr(self.owner, self.name, self.original)


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "torchmagic")
    return ip


def throughput(
    quick: bool, repeat: int, epochs: int, profile: bool
) -> tuple[Section, list[Check], str]:
    from IPython.utils.capture import capture_output

    section = Section("1. throughput: resnet18, digits 32 px, batch 64, full fine-tuning, SGD")
    train, _ = digits(32, train_size=256 if quick else None)
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = resnet18(weights=None, num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    train_loader = loader(train, shuffle=True)
    tm = Session(model, optimizer)
    ip = _shell()
    ip.push({"model": model, "optimizer": optimizer, "train_loader": train_loader})
    warm = 2 if quick else 3

    def hand() -> tuple[int, object]:
        return sum(hand_epoch(model, optimizer, train_loader, device) for _ in range(epochs)), None

    def engine() -> tuple[int, object]:
        history = tm.fit(train_loader, epochs=epochs)
        return history.samples, history

    probes = [
        _Probe(render.NotebookProgress, "on_step"),
        _Probe(render.NotebookProgress, "on_epoch"),
        _Probe(render.training.HistoryView, "_repr_mimebundle_"),
    ]
    magic_outputs: list[int] = []

    def magic() -> tuple[int, object]:
        before = len(tm_magic().fits)
        with capture_output() as captured:
            result = ip.run_cell(f"%fit train_loader --epochs {epochs}")
        result.raise_error()
        fits = tm_magic().fits
        shown = captured.outputs[-1].data["text/plain"] if captured.outputs else ""
        if len(fits) != before + 1 or "completed" not in shown:  # the result, where it drew
            raise RuntimeError(f"%fit did not complete: {shown[-500:]}{captured.stdout[-500:]}")
        magic_outputs.append(len(captured.outputs))
        return fits[-1].samples, fits[-1]

    def tm_magic() -> Session:
        return notebook_session()

    # warm-up: oneDNN primitives, the magic's imports (matplotlib for the chart)
    hand_epoch(model, optimizer, _first(train_loader, warm), device)
    tm.fit(train_loader, max_steps=warm)
    with capture_output():
        ip.run_cell(f"%fit train_loader --max-steps {warm}").raise_error()
    for p in probes:
        p.reset()

    variants = {"hand-written loop": hand, "Session.fit": engine, "%fit magic (IPython)": magic}
    runs: dict[str, list[Timed]] = {name: [] for name in variants}
    names = list(variants)
    clock = StepClock(optimizer)
    for i in range(repeat):
        for name in names[i % 3 :] + names[: i % 3]:
            runs[name].append(timed(variants[name], clock))
    clock.handle.remove()
    for p in probes:
        p.restore()

    hand_runs = runs["hand-written loop"]
    hand_rate = statistics.median(t.rate for t in hand_runs)
    hand_best = max(h.rate for h in hand_runs)
    hand_cpu = statistics.median(t.cpu / t.samples for t in hand_runs)
    hand_step = statistics.median(d for t in hand_runs for d in t.steps)
    checks: list[Check] = []
    epoch_rows, step_rows = [], []
    for name, timings in runs.items():
        rate = statistics.median(t.rate for t in timings)
        best = max(t.rate for t in timings)
        cpu = statistics.median(t.cpu / t.samples for t in timings)
        steps = [d for t in timings for d in t.steps]
        step = statistics.median(steps)
        epoch = Row(
            f"{name}: run",
            *_median_min([t.wall for t in timings]),
            "s/run",
            "1.000x (ref)",
            note=f"{rate:.1f} samples/s (best {best:.1f}); {1e3 * cpu:.1f} cpu-ms/sample",
        )
        per_step = Row(
            f"{name}: step",
            *_median_min([1e3 * d for d in steps], 1),
            "ms/step",
            "1.000x (ref)",
            note=f"{len(steps)} step intervals",
        )
        if name != "hand-written loop":
            paired = statistics.median(
                t.rate / h.rate for t, h in zip(timings, hand_runs, strict=True)
            )
            epoch.ratio = f"{rate / hand_rate:.3f}x hand"
            epoch.note += (
                f"; paired {paired:.3f}x, best {best / hand_best:.3f}x, cpu {hand_cpu / cpu:.3f}x"
            )
            per_step.ratio = f"{hand_step / step:.3f}x hand"
            for row, ratio, how in (
                (epoch, rate / hand_rate, "whole-run samples/s, median (as specified)"),
                (per_step, hand_step / step, "per-step time, median (robust to preemption)"),
            ):
                row.target, row.check = f">= {RATIO_TARGET}", ratio >= RATIO_TARGET
                checks.append(
                    Check(
                        f"{name} throughput = {ratio:.3f} x the hand-written loop; {how} "
                        f"(target >= {RATIO_TARGET})",
                        row.check,
                    )
                )
        epoch_rows.append(epoch)
        step_rows.append(per_step)
    samples = hand_runs[0].samples
    magic_runs = runs["%fit magic (IPython)"]
    on_step, on_epoch, final = probes
    n = len(magic_runs)
    view = final.seconds / max(final.calls, 1)
    without = [t.samples / (t.wall - view) for t in magic_runs]
    epoch_rows.append(
        Row(
            "%fit magic minus its final history view",
            *_median_min([t.wall - view for t in magic_runs]),
            "s/run",
            f"{statistics.median(without) / hand_rate:.3f}x hand",
            note=f"the view's mean {1e3 * view:.0f} ms (table + matplotlib chart) subtracted",
        )
    )
    section.rows += epoch_rows + step_rows
    rendering = on_step.seconds + on_epoch.seconds + final.seconds
    section.lines += [
        f"{samples // epochs} samples ({math.ceil(samples / epochs / BATCH)} batches) per epoch; "
        f"a run = {epochs} epoch(s) in one call; {repeat} timed runs per variant after {warm} "
        "warm-up steps; order rotated each repeat",
        "run ratio = median samples/s / the hand loop's; paired = median of per-repeat "
        "ratios; best = best/best; cpu = process CPU time per sample, hand / variant",
        "step = time between consecutive optimizer.step() completions (a step post-hook on "
        "the shared optimizer); the first of each epoch counts from the call's start"
        + (
            f"; the min is the short last batch ({samples // epochs} = "
            f"{samples // epochs // BATCH} x {BATCH} + {samples // epochs % BATCH})"
            if samples // epochs % BATCH
            else ""
        ),
        f"inside the %fit magic, per run: {on_step.calls / n:.1f} progress redraws "
        f"({1e3 * on_step.seconds / max(on_step.calls, 1):.1f} ms each), "
        f"{on_epoch.calls / n:.0f} epoch redraws "
        f"({1e3 * on_epoch.seconds / max(on_epoch.calls, 1):.1f} ms each), "
        f"{final.calls / n:.0f} final history view with chart ({1e3 * view:.0f} ms); "
        f"observer + final view = "
        f"{100 * rendering / sum(t.wall for t in magic_runs):.1f}% "
        f"of the magic's wall time; {statistics.median(magic_outputs):.0f} display outputs "
        "captured per run",
    ]
    profile_text = ""
    if profile:
        profile_text = _profile(
            "one Session.fit epoch (resnet18, 32 px)", lambda: tm.fit(train_loader, epochs=1)
        )
    return section, checks, profile_text


# -- 1b. accumulation and clipping -------------------------------------------------------


def hand_accumulating_epoch(model: nn.Module, optimizer, batches, device: torch.device) -> int:
    """Lightning's ``accumulate_grad_batches`` and ``gradient_clip_val``, by hand."""
    model.train()
    seen, last = 0, len(batches) - 1
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        (F.cross_entropy(model(x), y) / ACCUMULATE).backward()
        seen += len(y)
        if (i + 1) % ACCUMULATE == 0 or i == last:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad()
    return seen


def accumulation(quick: bool, repeat: int) -> tuple[Section, list[Check]]:
    section = Section(
        f"1b. accumulation: resnet18, digits 32 px, batch {BATCH}, accumulate={ACCUMULATE}, "
        f"clip={CLIP}, SGD"
    )
    train, _ = digits(32, train_size=256 if quick else None)
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = resnet18(weights=None, num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    train_loader = loader(train, shuffle=True)
    tm = Session(model, optimizer)

    def hand() -> tuple[int, object]:
        return hand_accumulating_epoch(model, optimizer, train_loader, device), None

    def engine() -> tuple[int, object]:
        history = tm.fit(train_loader, accumulate=ACCUMULATE, clip=CLIP)
        return history.samples, history

    hand_accumulating_epoch(model, optimizer, list(_first(train_loader, ACCUMULATE)), device)
    tm.fit(train_loader, accumulate=ACCUMULATE, clip=CLIP, max_steps=1)
    variants = {"hand-written accumulating loop": hand, "Session.fit(accumulate, clip)": engine}
    runs: dict[str, list[Timed]] = {name: [] for name in variants}
    names = list(variants)
    clock = StepClock(optimizer)
    for i in range(repeat):
        for name in names[i % 2 :] + names[: i % 2]:
            runs[name].append(timed(variants[name], clock))
    clock.handle.remove()
    hand_runs, engine_runs = runs[names[0]], runs[names[1]]
    checks: list[Check] = []
    for name, timings in runs.items():
        steps = [d for t in timings for d in t.steps]
        row = Row(
            name,
            *_median_min([t.wall for t in timings]),
            "s/run",
            "1.000x (ref)",
            note=f"{statistics.median(t.rate for t in timings):.1f} samples/s; "
            f"{statistics.median(1e3 * d for d in steps):.1f} ms/step (median)",
        )
        if timings is engine_runs:
            ratio = statistics.median(t.rate for t in timings) / statistics.median(
                t.rate for t in hand_runs
            )
            step_ratio = statistics.median(
                d for t in hand_runs for d in t.steps
            ) / statistics.median(steps)
            cpu = statistics.median(t.cpu / t.samples for t in hand_runs) / statistics.median(
                t.cpu / t.samples for t in timings
            )
            row.ratio = f"{ratio:.3f}x hand"
            row.target, row.check = f">= {RATIO_TARGET}", min(ratio, step_ratio) >= RATIO_TARGET
            row.note += f"; per step {step_ratio:.3f}x, cpu {cpu:.3f}x"
            checks.append(
                Check(
                    f"Session.fit(accumulate={ACCUMULATE}, clip={CLIP}) = {ratio:.3f} x the hand "
                    f"loop (whole runs), {step_ratio:.3f} x per step (target >= {RATIO_TARGET})",
                    row.check,
                )
            )
        section.rows.append(row)
    samples = hand_runs[0].samples
    section.lines.append(
        f"{samples} samples, {math.ceil(samples / BATCH)} batches, "
        f"{math.ceil(samples / BATCH / ACCUMULATE)} optimizer steps per run; {repeat} runs per "
        "variant, order alternated; step = time between optimizer.step() completions"
    )
    return section, checks


def _first(batches, n: int) -> Iterator:
    for i, batch in enumerate(batches):
        if i == n:
            return
        yield batch


def _profile(title: str, call: Callable[[], object]) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"torchmagic", 15)
    stats.sort_stats("tottime").print_stats(12)
    keep = [
        line for line in out.getvalue().splitlines() if line.strip() and "Ordered by" not in line
    ]
    return "\n".join([f"\n### cProfile: {title}", *keep])


# -- 2. cached features ------------------------------------------------------------------


def cached_features(quick: bool, cached_repeat: int) -> tuple[Section, list[Check]]:
    section = Section(
        f"2. --cache-features: resnet18 head only (freeze all but fc, BN eval), digits 64 px, "
        f"{CACHE_EPOCHS} epochs + validation each epoch"
    )
    train, test = digits(64, *((256, 128) if quick else (None, None)))
    torch.manual_seed(0)
    initial = copy.deepcopy(resnet18(weights=None, num_classes=10).state_dict())

    def run(cached: bool) -> tuple[int, object]:
        model = resnet18(weights=None, num_classes=10)
        model.load_state_dict(initial)
        optimizer = torch.optim.SGD(model.parameters(), lr=HEAD_LR, momentum=0.9)
        tm = Session(model, optimizer)
        tm.freeze(exclude=["fc"])
        torch.manual_seed(1)
        history = tm.fit(
            loader(train, shuffle=True, seed=1),
            val=loader(test, shuffle=False),
            epochs=CACHE_EPOCHS,
            cache_features=cached,
        )
        if history.stopped:
            raise RuntimeError(f"the {'cached' if cached else 'uncached'} run stopped early")
        return history.samples, (history, model.fc.weight.detach(), model.fc.bias.detach())

    uncached = timed(lambda: run(False))
    cached_runs = [timed(lambda: run(True)) for _ in range(cached_repeat)]
    cached = cached_runs[0]
    h_u, w_u, b_u = uncached.result
    h_c, w_c, b_c = cached.result
    cached_walls = [t.wall for t in cached_runs]
    speedup = uncached.wall / statistics.median(cached_walls)
    spread = max(
        max(float((t.result[1] - w_c).abs().max()), float((t.result[2] - b_c).abs().max()))
        for t in cached_runs
    )
    acc_u, acc_c = h_u.epochs[-1].val_accuracy, h_c.epochs[-1].val_accuracy
    points = 100 * abs(acc_u - acc_c)
    diff = max(float((w_u - w_c).abs().max()), float((b_u - b_c).abs().max()))
    later = [m.seconds for t in cached_runs for m in t.result[0].epochs[1:]]
    section.rows += [
        Row(
            "uncached: whole fit",
            f"{uncached.wall:.1f}",
            f"{uncached.wall:.1f}",
            "s",
            "1.0x (ref)",
            note=f"1 run; test acc {100 * acc_u:.2f}%; cpu {uncached.cpu:.1f} s",
        ),
        Row(
            "uncached: train epoch",
            *_median_min([m.seconds for m in h_u.epochs]),
            "s",
            note=f"{len(h_u.epochs)} epochs, validation excluded",
        ),
        Row(
            "cached: whole fit (feature pass included)",
            *_median_min(cached_walls, 1),
            "s",
            f"{speedup:.1f}x faster",
            f">= {SPEEDUP_TARGET:g}x",
            speedup >= SPEEDUP_TARGET,
            f"{len(cached_runs)} runs; test acc {100 * acc_c:.2f}%; "
            f"cpu {statistics.median(t.cpu for t in cached_runs):.1f} s; "
            f"{uncached.wall / min(cached_walls):.1f}x vs the fastest",
        ),
        Row(
            "cached: epoch 1 (backbone pass + head)",
            *_median_min([t.result[0].epochs[0].seconds for t in cached_runs]),
            "s",
        ),
        Row("cached: epochs 2+ (head on stored features)", *_median_min(later, 3), "s"),
        Row(
            "final test accuracy, |cached - uncached|",
            f"{points:.2f}",
            "",
            "points",
            target=f"<= {ACCURACY_POINTS:g}",
            check=points <= ACCURACY_POINTS,
            note=f"uncached {100 * acc_u:.2f}%, cached {100 * acc_c:.2f}%",
        ),
        Row(
            "final head weights, max |cached - uncached|",
            f"{diff:.2e}",
            "",
            "abs",
            note=f"max |difference| between the cached runs: {spread:.2e}",
        ),
    ]
    section.lines.append(
        f"{len(train)} train / {len(test)} test samples; {h_u.steps} head steps per run; "
        f"same initial weights, shuffle seed and global seed; SGD lr {HEAD_LR}, momentum 0.9"
    )
    checks = [
        Check(
            f"--cache-features speed-up {speedup:.1f}x (target >= {SPEEDUP_TARGET:g}x)",
            speedup >= SPEEDUP_TARGET,
        ),
        Check(
            f"--cache-features final test accuracy {100 * acc_c:.2f}% vs {100 * acc_u:.2f}% "
            f"uncached: {points:.2f} points apart (target <= {ACCURACY_POINTS:g})",
            points <= ACCURACY_POINTS,
        ),
    ]
    return section, checks


# -- 3. bf16 autocast on the CPU ---------------------------------------------------------


def cpu_bf16(quick: bool, repeat: int) -> Section:
    section = Section("3. %amp bf16 on the CPU: resnet18 training step, digits 32 px, batch 64")
    train, _ = digits(32, train_size=512 if quick else None)
    torch.manual_seed(0)
    model = resnet18(weights=None, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    tm = Session(model, optimizer)
    train_loader = loader(train, shuffle=True)
    steps = 4 if quick else 6

    def fp32() -> tuple[int, object]:
        tm.amp.turn_off()
        history = tm.fit(train_loader, max_steps=steps)
        return history.steps, history

    def bf16() -> tuple[int, object]:
        tm.amp_on("bf16")
        history = tm.fit(train_loader, max_steps=steps)
        assert history.precision == "bf16", history.precision
        return history.steps, history

    tm.fit(train_loader, max_steps=2)  # warm-up: oneDNN primitives for both dtypes
    tm.amp_on("bf16")
    tm.fit(train_loader, max_steps=2)
    runs: dict[str, list[Timed]] = {"fp32": [], "bf16 autocast": []}
    clock = StepClock(optimizer)
    for i in range(repeat):
        order = [("fp32", fp32), ("bf16 autocast", bf16)]
        for name, call in order if i % 2 == 0 else order[::-1]:
            runs[name].append(timed(call, clock))
    clock.handle.remove()
    tm.amp.turn_off()
    per_step = {k: [1e3 * d for t in v for d in t.steps] for k, v in runs.items()}
    cpu_step = {k: statistics.median(1e3 * t.cpu / t.samples for t in v) for k, v in runs.items()}
    ref = statistics.median(per_step["fp32"])
    for name, values in per_step.items():
        ratio = statistics.median(values) / ref
        section.rows.append(
            Row(
                name,
                *_median_min(values, 0),
                "ms/step",
                "1.00x (ref)" if name == "fp32" else f"{ratio:.2f}x fp32 time",
                note=f"cpu {cpu_step[name]:.0f} ms/step",
            )
        )
    section.lines.append(
        f"Session.fit(max_steps={steps}) per run, {repeat} runs each, alternating; per-step "
        "intervals from an optimizer step post-hook; no target"
    )
    return section


# -- 4. GPU ------------------------------------------------------------------------------


class DeviceBatches:
    """Shuffled batches of tensors already on the device (no DataLoader in the way)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int = 0) -> None:
        self.x, self.y, self.batch = x, y, batch
        self.generator = torch.Generator(device=x.device).manual_seed(seed)

    def __len__(self) -> int:
        return len(self.y) // self.batch

    def __iter__(self):
        order = torch.randperm(len(self.y), device=self.x.device, generator=self.generator)
        for i in range(len(self)):
            index = order[i * self.batch : (i + 1) * self.batch]
            yield self.x[index], self.y[index]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu(
    quick: bool,
    device: torch.device | None = None,
    modes: tuple[str, ...] = ("fp32", "fp16", "bf16"),
    arch: Callable[..., nn.Module] = resnet50,
    steps: int | None = None,
) -> tuple[Section, list[Check]]:
    """fp32 / fp16 + GradScaler / bf16 training runs (``device`` and ``arch`` are for
    trying this section's code on the CPU)."""
    section = Section(
        f"4. GPU: {arch.__name__}, digits 64 px, batch 64, fp32 vs fp16 + GradScaler vs bf16"
    )
    if device is None:
        if not torch.cuda.is_available():
            section.lines.append("no CUDA device: skipped")
            return section, [Check("GPU section: no CUDA device: skipped", None)]
        device = torch.device("cuda")
    steps = steps or (60 if quick else GPU_STEPS)
    train, _ = digits(64)
    x, y = train.tensors[0].to(device), train.tensors[1].to(device)
    torch.manual_seed(0)
    initial = copy.deepcopy(arch(weights=None, num_classes=10).state_dict())
    checks, rates = [], {}
    for mode in modes:

        def session(mode: str = mode) -> tuple[nn.Module, Session]:
            model = arch(weights=None, num_classes=10)
            model.load_state_dict(initial)
            model.to(device)
            tm = Session(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9))
            if mode != "fp32":
                tm.amp_on(mode)
            return model, tm

        _, warm = session()  # warm-up on a throwaway copy: kernels, autotuning
        warm.fit(DeviceBatches(x, y, BATCH, seed=1), max_steps=10)
        _sync(device)
        _, tm = session()
        batches = DeviceBatches(x, y, BATCH, seed=2)
        epochs = math.ceil(steps / len(batches))
        _sync(device)
        start = time.perf_counter()
        history = tm.fit(batches, epochs=epochs, max_steps=steps)
        _sync(device)
        wall = time.perf_counter() - start
        losses = [m.train_loss for m in history.epochs]
        finite = (
            all(math.isfinite(v) for v in losses)
            and history.stop_reason is not StopReason.NON_FINITE_LOSS
        )
        decreasing = finite and losses[-1] < losses[0]
        rates[mode] = history.samples / wall
        status = tm.amp.status()
        note = f"loss {losses[0]:.3f} (epoch 1) -> {losses[-1]:.3f} (epoch {len(losses)})"
        if status.scaler:
            note += f"; GradScaler scale {status.scale:g}"
        section.rows.append(
            Row(
                f"{mode}{' + GradScaler' if status.scaler else ''}",
                f"{rates[mode]:.0f}",
                "",
                "samples/s",
                "1.00x (ref)" if mode == "fp32" else "",
                "finite, decreasing",
                decreasing,
                f"{history.steps} steps, precision {history.precision}; {note}",
            )
        )
        checks.append(Check(f"GPU {mode}: loss finite and decreasing ({note})", decreasing))
    if "fp32" in rates:
        for row, mode in zip(section.rows, modes, strict=True):
            if mode != "fp32":
                row.ratio = f"{rates[mode] / rates['fp32']:.2f}x fp32"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    section.lines.append(
        f"device {name}; {steps} steps per mode after 10 warm-up steps on a throwaway copy"
    )
    return section, checks


# -- 5. GPU throughput against a sync-free hand loop -------------------------------------


def sync_free_steps(
    model: nn.Module, optimizer, batches, steps: int, device_type: str, dtype: torch.dtype
) -> int:
    """The bar: forward under autocast, backward, step, zero_grad; nothing read back."""
    model.train()
    seen = done = 0
    while done < steps:
        for x, y in batches:
            with torch.autocast(device_type, dtype=dtype):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seen += len(y)
            done += 1
            if done == steps:
                break
    return seen


def gpu_throughput(
    quick: bool,
    device: torch.device | None = None,
    arch: Callable[..., nn.Module] = resnet50,
    px: int = 128,
    steps: int | None = None,
    repeat: int = 3,
) -> tuple[Section, list[Check]]:
    """Session.fit and the %fit magic against the sync-free hand loop, bf16 autocast
    (``device``, ``arch``, ``px`` and ``steps`` are for trying this code on the CPU)."""
    from IPython.utils.capture import capture_output

    section = Section(
        f"5. GPU throughput: {arch.__name__}, digits {px} px, batch {BATCH}, bf16 autocast, "
        "SGD momentum, batches on the device, against a hand loop without host syncs"
    )
    if device is None:
        if not torch.cuda.is_available():
            section.lines.append("no CUDA device: skipped")
            return section, [Check("GPU throughput: no CUDA device: skipped", None)]
        device = torch.device("cuda")
    steps = steps or (30 if quick else GPU_RUN_STEPS)
    train, _ = digits(px)
    batches = DeviceBatches(train.tensors[0].to(device), train.tensors[1].to(device), BATCH)
    epochs = math.ceil(steps / len(batches))
    torch.manual_seed(0)
    model = arch(weights=None, num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    tm = Session(model, optimizer)
    tm.amp_on("bf16")
    ip = _shell()
    ip.push({"model": model, "optimizer": optimizer, "batches": batches})
    with capture_output():
        ip.run_cell("%amp on bf16").raise_error()
    magic_session = notebook_session()

    def hand() -> int:
        return sync_free_steps(model, optimizer, batches, steps, device.type, torch.bfloat16)

    def engine() -> int:
        return tm.fit(batches, epochs=epochs, max_steps=steps).samples

    def magic() -> int:
        before = len(magic_session.fits)
        with capture_output():
            result = ip.run_cell(f"%fit batches --epochs {epochs} --max-steps {steps}")
        result.raise_error()
        if len(magic_session.fits) != before + 1:
            raise RuntimeError("%fit did not run")
        return magic_session.fits[-1].samples

    variants = {"sync-free hand loop": hand, "Session.fit": engine, "%fit magic": magic}
    for call in variants.values():  # warm-up: kernels, cuDNN autotuning, imports
        call()
    rates: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(repeat):
        for name in names[i % 3 :] + names[: i % 3]:
            _sync(device)
            start = time.perf_counter()
            samples = variants[name]()
            _sync(device)
            rates[name].append(samples / (time.perf_counter() - start))
    hand_rates = rates["sync-free hand loop"]
    hand_rate = statistics.median(hand_rates)
    checks = []
    targets = {"Session.fit": GPU_ENGINE_TARGET, "%fit magic": GPU_MAGIC_TARGET}
    for name, values in rates.items():
        rate = statistics.median(values)
        row = Row(
            name,
            f"{rate:.0f}",
            f"{min(values):.0f}",
            "samples/s",
            "1.000x (ref)",
            note=f"{len(values)} runs of {steps} steps",
        )
        if name in targets:
            ratio = rate / hand_rate
            paired = statistics.median(v / h for v, h in zip(values, hand_rates, strict=True))
            row.ratio = f"{ratio:.3f}x hand"
            row.target, row.check = f">= {targets[name]}", ratio >= targets[name]
            row.note += f"; paired {paired:.3f}x"
            checks.append(
                Check(
                    f"GPU {name} = {ratio:.3f} x the sync-free hand loop "
                    f"(target >= {targets[name]})",
                    row.check,
                )
            )
        section.rows.append(row)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    section.lines.append(
        f"device {name}; {len(batches)} batches per epoch; order rotated each repeat; "
        "each run after one untimed warm-up run of every variant; the device is synchronised "
        "around every timed run"
    )
    return section, checks


# -- main --------------------------------------------------------------------------------


def _load() -> str:
    if not hasattr(os, "getloadavg"):
        return "n/a"
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (indicative)")
    parser.add_argument(
        "--repeat", type=int, default=None, help="timed epochs per variant (default 5; quick 2)"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs per timed run (default 2; quick 1)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: see the module docstring)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile one Session.fit epoch of section 1"
    )
    args = parser.parse_args(argv)
    repeat = args.repeat or (2 if args.quick else 5)
    if repeat < 2:
        parser.error("--repeat must be >= 2")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)

    print("# torchmagic training throughput (bench/fit.py)" + (" --quick" if args.quick else ""))
    print(describe())
    print(f"load average at start: {_load()}")
    print(f"run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    start = time.perf_counter()
    checks: list[Check] = []

    epochs = args.epochs or (1 if args.quick else 2)
    section, found, profile_text = throughput(args.quick, repeat, epochs, args.profile)
    section.print()
    checks += found
    section, found = accumulation(args.quick, repeat)
    section.print()
    checks += found
    section, found = cached_features(args.quick, 2 if args.quick else 3)
    section.print()
    checks += found
    cpu_bf16(args.quick, repeat).print()
    section, found = gpu(args.quick)
    section.print()
    checks += found
    section, found = gpu_throughput(args.quick)
    section.print()
    checks += found

    print("\n## targets" + (" (--quick: indicative only)" if args.quick else ""))
    for check in checks:
        print(f"{VERDICTS[check.ok]}  {check.text}")
    judged = [c for c in checks if c.ok is not None]
    met = sum(1 for c in judged if c.ok)
    print(
        f"{met}/{len(judged)} targets met; total {time.perf_counter() - start:.0f} s; "
        f"load average at end: {_load()}"
    )
    if profile_text:
        print(profile_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
