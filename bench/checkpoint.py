"""Save and resume: ``Session.save`` / ``torchmagic.resume`` against the hand-written
``torch.save`` of the model's, optimizer's and scheduler's ``state_dict``.

Not a test. Run from the repository root::

    .venv/bin/python bench/checkpoint.py [--models resnet50,vit_b_16] [--repeat 5]

Per model (torchvision, ``weights=None``, AdamW over all parameters, CosineAnnealingLR):
the session freezes the first half of the backbone, replaces the head, unfreezes one
block at its own lr and takes one training step (so Adam state exists), then

* save: ``tm.save(path)`` (temporary file, fsync, rename) against
  ``torch.save({"model": ..., "optimizer": ..., "scheduler": ...}, path)`` by hand, which
  neither syncs nor renames; a third row adds ``os.fsync`` to the hand-written save, the
  part of the difference that is durability;
* resume: ``torchmagic.resume(path, model, optimizer, [scheduler])`` on a freshly built
  model (replaying the commands, checking, loading by name) against the hand-written load
  (``torch.load(weights_only=True)`` and three ``load_state_dict`` calls) on a fresh model
  whose surgery was redone by hand (not timed);
* file sizes.

Medians (ms) over ``--repeat`` runs, ours and by hand alternating (both meet the same
load), the ratio ours / by hand of wall and of CPU time (``time.thread_time``, what the
work costs on a shared machine), and a PASS/FAIL line per target (wall within 1.2x).
The page cache makes a re-read fast: every resume reads a file just written, as a resume
right after a save would.
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
        ("conv_proj", "encoder.layers.encoder_layer_0-5"),
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


def by_hand(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """What a user rebuilding without torchmagic writes: the same surgery by hand."""
    frozen, head, again = SPECS[name]
    tm = torchmagic.Session(model)  # no optimizer: flags and the head only
    tm.freeze(*frozen)
    tm.replace_head(head, 10)
    tm.unfreeze(again)
    again_params = {id(p) for p in model.get_submodule(again).parameters()}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in again_params]
    block = [p for p in model.parameters() if id(p) in again_params]
    return torch.optim.AdamW([{"params": rest}, {"params": block, "lr": 1e-4}], lr=1e-3)


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
            start, start_cpu = time.perf_counter(), time.thread_time()
            run()
            cpu[key].append((time.thread_time() - start_cpu) * 1000)
            wall[key].append((time.perf_counter() - start) * 1000)
    med = statistics.median
    return med(wall["ours"]), med(wall["hand"]), med(cpu["ours"]), med(cpu["hand"])


def hand_save(model, opt, sched, path: str, sync: bool) -> None:
    """What a user writes: one ``torch.save`` of the three state_dicts, by file name."""
    states = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    torch.save({**states, "scheduler": sched.state_dict()}, path)
    if sync:
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
        lambda: tm.save(ours), lambda: hand_save(model, opt, sched, theirs, False), repeat
    )
    synced = paired(
        lambda: tm.save(ours), lambda: hand_save(model, opt, sched, theirs, True), repeat
    )
    sizes = os.path.getsize(ours), os.path.getsize(theirs)
    fresh: list = []

    def rebuild_ours() -> None:
        fresh[:] = build(name)

    def rebuild_hand() -> None:
        m, _, _ = build(name)
        o = by_hand(name, m)
        fresh[:] = m, o, torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10)

    def resume_ours() -> None:
        torchmagic.resume(ours, fresh[0], fresh[1], [fresh[2]])

    def resume_hand() -> None:
        payload = torch.load(theirs, weights_only=True)
        fresh[0].load_state_dict(payload["model"])
        fresh[1].load_state_dict(payload["optimizer"])
        fresh[2].load_state_dict(payload["scheduler"])

    resume = paired(resume_ours, resume_hand, repeat, rebuild_ours, rebuild_hand)
    mib = 1 << 20
    size = (sizes[0] / mib, sizes[1] / mib, 0.0, 0.0)
    return [
        ("save", *save),
        ("save vs hand + fsync", *synced),
        ("resume", *resume),
        ("file MiB", *size),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vit_b_16")
    parser.add_argument("--repeat", type=int, default=5)
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
                if what in ("save", "resume", "file MiB"):
                    verdict = ratio <= TARGET
                    failed |= not verdict
                    print(f"{'':<32} wall within {TARGET}x: {'PASS' if verdict else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
