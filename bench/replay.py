"""``torchmagic.resume`` after 10 / 100 / 500 / 1,000 commands, against the hand-written
resume of the same end state.

Not a test. Run from the repository root::

    .venv/bin/python bench/replay.py [--counts 10,100,500,1000] [--repeat 5] [--full]

Per count: resnet18 (``weights=None``), SGD with momentum, a session that replaces the head,
unfreezes ``layer4`` at its own lr and freezes it again, then alternates
``freeze("layer1")`` / ``unfreeze("layer1")`` up to the count (the notebook's back and
forth), takes one training step and saves. Timed on a fresh build each run:

* ours: ``torchmagic.resume(path, model, optimizer)`` (read and verify the file, replay the
  commands, check the result by name, load every state);
* by hand: what a user writes without it for the same end state: the new head and the
  groups built in plain torch, ``torch.load(weights_only=True)`` of a plain
  ``{"model": …, "optimizer": …}`` file and two ``load_state_dict`` calls;
* with ``--full``: ours with every command run again (no repetition skipped), the cost
  before repetitions were recognised.

Medians (ms) of wall and CPU time (``time.thread_time``, what the work costs on a shared
machine) over ``--repeat`` runs, ours and by hand alternating, the ratio ours / by hand, and
a PASS/FAIL line for the target: under 1 s for 1,000 commands, and time per command flat
(the 1,000-command resume within 2.5x the 100-command one; the file's own size grows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from machine import describe
from torch import nn
from torchvision import models

import torchmagic
from torchmagic.core.session import replay

TARGET_S = 1.0


def build(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = models.resnet18(weights=None)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def session_file(count: int, folder: str) -> tuple[str, str, list]:
    """The session's file after ``count`` commands, the hand-written file of its state, and
    its group layout (members by name, hyper-parameters) for the hand-written resume."""
    model, opt = build()
    tm = torchmagic.Session(model, opt)
    tm.replace_head("fc", 10)
    tm.unfreeze("layer4", lr=1e-3)  # a group of its own ...
    tm.freeze("layer4")  # ... emptied: home groups that differ from the first layout
    for i in range(count - 3):
        (tm.freeze if i % 2 == 0 else tm.unfreeze)("layer1")
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    opt.step()
    ours, by_hand = os.path.join(folder, f"ours{count}.pt"), os.path.join(folder, f"hand{count}.pt")
    tm.save(ours)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, by_hand)
    names = {id(p): n for n, p in model.named_parameters()}
    layout = [
        ([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
        for g in opt.param_groups
    ]
    return ours, by_hand, layout


def hand_resume(path: str, layout: list) -> None:
    """The same end state without torchmagic: the new head, the flags and the groups built
    in plain torch, then ``torch.load`` and two ``load_state_dict``."""
    model, _ = build(seed=1)
    model.fc = nn.Linear(model.fc.in_features, 10)
    params = dict(model.named_parameters())
    trained = {n for members, _ in layout for n in members}
    for name, p in params.items():
        p.requires_grad_(name in trained)
    opt = torch.optim.SGD(
        [{"params": [params[n] for n in members], **hyper} for members, hyper in layout]
    )
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])


def ours_resume(path: str) -> None:
    model, opt = build(seed=1)
    torchmagic.resume(path, model, opt)


def timed(action: Callable[..., None], *args: object) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    action(*args)
    return time.perf_counter() - wall, time.thread_time() - cpu


def every_command(path: str) -> None:
    """Ours with no structure ever seen twice: every command run again."""
    real = replay.structure
    replay.structure = lambda session, target: object()  # type: ignore[assignment]
    try:
        ours_resume(path)
    finally:
        replay.structure = real


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="10,100,500,1000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="also time every command run")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    print(describe())
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'commands':>8} | {'ours ms':>8} | {'cpu ms':>7} | {'by hand ms':>10} | "
        f"{'cpu ms':>7} | {'ratio':>5} | {'ours/cmd ms':>11}"
        + (" | every command ms" if args.full else "")
    )
    medians: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for count in counts:
            ours_path, hand_path, layout = session_file(count, folder)
            ours, hand = [], []
            for _ in range(args.repeat):
                ours.append(timed(ours_resume, ours_path))
                hand.append(timed(hand_resume, hand_path, layout))
            o_wall, o_cpu = (statistics.median(x) * 1e3 for x in zip(*ours, strict=True))
            h_wall, h_cpu = (statistics.median(x) * 1e3 for x in zip(*hand, strict=True))
            medians[count] = o_wall, o_cpu
            line = (
                f"{count:>8} | {o_wall:>8.0f} | {o_cpu:>7.0f} | {h_wall:>10.0f} | {h_cpu:>7.0f} | "
                f"{o_wall / h_wall:>5.2f} | {o_wall / count:>11.2f}"
            )
            if args.full:
                line += f" | {timed(every_command, ours_path)[0] * 1e3:.0f}"
            print(line, flush=True)
    if 1000 in medians and 100 in medians:
        for i, what in enumerate(("wall", "CPU")):
            at_1000, at_100 = medians[1000][i], medians[100][i]
            verdict = at_1000 < TARGET_S * 1e3 and at_1000 < 2.5 * at_100
            print(
                f"{'PASS' if verdict else 'FAIL'} ({what}): 1,000 commands in {at_1000:.0f} ms "
                f"(target < {TARGET_S * 1e3:.0f} ms, and within 2.5x the 100-command "
                f"resume: {at_100:.0f} ms)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
