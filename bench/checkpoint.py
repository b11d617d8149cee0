"""Save and resume: ``Session.save`` / ``torchmagic.resume`` against the hand-written
``torch.save`` of the model's, optimizer's and scheduler's ``state_dict``.

Not a test. Run from the repository root::

    .venv/bin/python bench/checkpoint.py [--models resnet50,vit_b_16] [--repeat 9]

Per model (torchvision, ``weights=None``, AdamW over all parameters, CosineAnnealingLR):
the session freezes the first half of the backbone, replaces the head, unfreezes one
block at its own lr and takes one training step (so Adam state exists), then

* save: ``tm.save(path)`` (temporary file, rename) against
  ``torch.save({"model": ..., "optimizer": ..., "scheduler": ...}, path)`` by hand, which
  neither syncs nor renames (it overwrites the old file in place); a second row renames a
  temporary file over it by hand too (the same atomic write on both sides); a third times
  ``tm.save(path, sync=True)`` against the hand-written save followed by ``os.fsync``;
* resume: ``torchmagic.resume(path, model, optimizer, [scheduler])`` on a freshly built
  model (replaying the commands, checking, loading by name) against what a user writes
  without it on the same fresh build: the surgery redone in plain torch (flags, the new
  head, the optimizer's groups, the scheduler), ``torch.load(weights_only=True)`` and three
  ``load_state_dict`` calls; a second row leaves the hand-written surgery out of the timing
  (the loads alone: what the replay and the checks cost);
* file sizes.

Medians (ms) over ``--repeat`` runs, ours and by hand alternating (both meet the same
load), the ratio ours / by hand of wall and of CPU time (``time.thread_time``, what the
work costs on a shared machine), and a PASS/FAIL line per target (wall within 1.2x).
Every timed run starts after an untimed ``os.sync()``, so no earlier run's writeback
competes with it (identical 700 MiB saves otherwise vary 0.8–3 s on a virtual disk). The
page cache makes a re-read fast: every resume reads a file just written, as a resume right
after a save would.
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
from torchvision import models

import torchmagic

TARGET = 1.2
# model -> (frozen blocks, the head, the block unfrozen again at its own lr)
SPECS = {
    "resnet50": (("conv1", "bn1", "layer1", "layer2", "layer3"), "fc", "layer3"),
    "vit_b_16": (
        ("conv_proj", *(f"encoder.layers.encoder_layer_{i}" for i in range(6))),
        "heads.head",
        "encoder.layers.encoder_layer_5",
    ),
}


def build(name: str):
    torch.manual_seed(0)
    model = getattr(models, name)(weights=None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


def surgery(name: str, tm: torchmagic.Session) -> None:
    frozen, head, again = SPECS[name]
    tm.freeze(*frozen)
    tm.replace_head(head, 10)
    tm.unfreeze(again, lr=1e-4)


def by_hand(name: str, model: torch.nn.Module):
    """What a user rebuilding without torchmagic writes: the same surgery in plain torch
    (flags, a new head, an optimizer with the block in its own group, the scheduler)."""
    frozen, head, again = SPECS[name]
    for block in frozen:
        model.get_submodule(block).requires_grad_(False)
    parent, _, attr = head.rpartition(".")
    old = model.get_submodule(head)
    setattr(model.get_submodule(parent), attr, torch.nn.Linear(old.in_features, 10))
    model.get_submodule(again).requires_grad_(True)
    again_params = {id(p) for p in model.get_submodule(again).parameters()}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in again_params]
    block = [p for p in model.parameters() if id(p) in again_params]
    opt = torch.optim.AdamW([{"params": rest}, {"params": block, "lr": 1e-4}], lr=1e-3)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


def one_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 3, 224, 224)).sum().backward()
    opt.step()
    opt.zero_grad()


def paired(
    ours: Callable[[], object],
    hand: Callable[[], object],
    repeat: int,
    before_ours: Callable[[], object] = lambda: None,
    before_hand: Callable[[], object] = lambda: None,
) -> tuple[float, float, float, float]:
    """Median wall and CPU ms of ``ours`` and ``hand``, run alternately (so both meet the
    same load): (ours wall, hand wall, ours cpu, hand cpu)."""
    wall: dict[str, list[float]] = {"ours": [], "hand": []}
    cpu: dict[str, list[float]] = {"ours": [], "hand": []}
    for _ in range(repeat):
        for key, run, before in (("ours", ours, before_ours), ("hand", hand, before_hand)):
            before()
            os.sync()  # untimed: no other run's writeback in flight while this one runs
            start, start_cpu = time.perf_counter(), time.thread_time()
            run()
            cpu[key].append((time.thread_time() - start_cpu) * 1000)
            wall[key].append((time.perf_counter() - start) * 1000)
    med = statistics.median
    return med(wall["ours"]), med(wall["hand"]), med(cpu["ours"]), med(cpu["hand"])


def hand_save(model, opt, sched, path: str, how: str) -> None:
    """What a user writes: one ``torch.save`` of the three state_dicts, by file name,
    over the old file (``plain``), into a temporary file renamed over it (``atomic``), or
    over the old file and then ``os.fsync`` (``synced``)."""
    states = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    where = f"{path}.tmp" if how == "atomic" else path
    torch.save({**states, "scheduler": sched.state_dict()}, where)
    if how == "atomic":
        os.replace(where, path)
    if how == "synced":
        handle = os.open(path, os.O_RDONLY)
        os.fsync(handle)
        os.close(handle)


def bench(name: str, repeat: int, folder: str) -> list[tuple[str, float, float]]:
    model, opt, sched = build(name)
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    surgery(name, tm)
    one_step(model, opt)
    sched.step()
    ours, theirs = os.path.join(folder, "ours.pt"), os.path.join(folder, "theirs.pt")
    save = paired(
        lambda: tm.save(ours), lambda: hand_save(model, opt, sched, theirs, "plain"), repeat
    )
    atomic = paired(
        lambda: tm.save(ours), lambda: hand_save(model, opt, sched, theirs, "atomic"), repeat
    )
    synced = paired(
        lambda: tm.save(ours, sync=True),
        lambda: hand_save(model, opt, sched, theirs, "synced"),
        repeat,
    )
    sizes = os.path.getsize(ours), os.path.getsize(theirs)
    fresh: list = []

    def rebuild() -> None:
        fresh[:] = build(name)

    def resume_ours() -> None:
        torchmagic.resume(ours, fresh[0], fresh[1], [fresh[2]])

    def load_by_hand(model, opt, sched) -> None:
        payload = torch.load(theirs, weights_only=True)
        model.load_state_dict(payload["model"])
        opt.load_state_dict(payload["optimizer"])
        sched.load_state_dict(payload["scheduler"])

    def resume_hand() -> None:
        load_by_hand(fresh[0], *by_hand(name, fresh[0]))

    def rebuild_with_surgery() -> None:
        model = build(name)[0]
        fresh[:] = model, *by_hand(name, model)

    resume = paired(resume_ours, resume_hand, repeat, rebuild, rebuild)
    loads = paired(resume_ours, lambda: load_by_hand(*fresh), repeat, rebuild, rebuild_with_surgery)
    mib = 1 << 20
    size = (sizes[0] / mib, sizes[1] / mib, 0.0, 0.0)
    return [
        ("save", *save),
        ("save vs atomic hand", *atomic),
        ("save --sync", *synced),
        ("resume", *resume),
        ("resume vs loads only", *loads),
        ("file MiB", *size),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vit_b_16")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe())
    print(f"load average {os.getloadavg()[0]:.1f}, repeat {args.repeat}\n")
    print(f"{'model':<10} {'what':<21} {'ours':>9} {'by hand':>9} {'ratio':>7} {'cpu ratio':>9}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="tm-bench-ckpt-") as folder:
        for name in args.models.split(","):
            for what, ours, hand, ours_cpu, hand_cpu in bench(name, args.repeat, folder):
                ratio = ours / hand
                cpu = f"{ours_cpu / hand_cpu:>8.3f}x" if hand_cpu else ""
                print(f"{name:<10} {what:<21} {ours:>9.1f} {hand:>9.1f} {ratio:>6.3f}x {cpu:>9}")
                if what in ("save", "save --sync", "resume", "file MiB"):
                    verdict = ratio <= TARGET
                    failed |= not verdict
                    print(f"{'':<32} wall within {TARGET}x: {'PASS' if verdict else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
