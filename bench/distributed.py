"""What the distributed checks cost: finding the DDP wrappers of a model before surgery,
and the guard a resumed optimizer's ``step()`` runs.

Not a test. Run from the repository root::

    .venv/bin/python bench/distributed.py [--repeat 9]

In a one-rank gloo group on 127.0.0.1 (a file store), resnet50 (torchvision,
``weights=None``) wrapped in DistributedDataParallel, AdamW over it, with torch,
torchvision and torchmagic loaded:

* ``tm.freeze("layer1")`` + ``tm.undo()`` through a Session given the wrapper (found in
  its namespace) against a Session given the raw module (the wrapper found among the live
  objects: one pass over ``gc.get_objects()``), and that pass alone;
* the step guard of a resumed optimizer (``optimizer.step()`` pre-hook) on its own: after
  a backward (it stops at the first parameter with a gradient) and without gradients (it
  looks at the model's parameters), against one AdamW ``step()`` of resnet50.

Medians over ``--repeat`` runs of wall and CPU time (``time.thread_time``: what the work
costs on a shared machine), and the number of objects the collector tracks.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from machine import describe
from torch import nn
from torchvision import models

import torchmagic
from torchmagic.core import distributed


def median_ms(fn, repeat: int) -> tuple[float, float]:
    """Median wall and CPU (this thread's) milliseconds of ``fn()``."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn()
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.thread_time() - start_cpu) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=9)
    repeat = parser.parse_args().repeat
    print(describe())
    print(f"load average {os.getloadavg()[0]:.1f}")
    store = tempfile.mktemp(prefix="tm-bench-store-")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = models.resnet50(weights=None)
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        given_wrapper = torchmagic.Session(ddp, opt)
        given_module = torchmagic.Session(model, opt)

        def surgery(tm) -> None:
            tm.freeze("layer1")
            tm.undo()

        rows = [
            (
                "freeze + undo, session given the wrapper",
                median_ms(lambda: surgery(given_wrapper), repeat),
            ),
            (
                "freeze + undo, session given the module",
                median_ms(lambda: surgery(given_module), repeat),
            ),
            (
                "the pass over live objects alone",
                median_ms(lambda: distributed._unbound_ddps(model), repeat),
            ),
        ]
        x = torch.randn(8, 3, 64, 64)
        ddp = torchmagic.rewrap(ddp)  # the guarded wrapper is stale after the surgery

        def one_step() -> None:
            ddp(x).sum().backward()
            opt.step()
            opt.zero_grad()

        one_step()  # Adam state made
        ddp(x).sum().backward()
        step_ms = median_ms(opt.step, repeat)
        path = os.path.join(tempfile.mkdtemp(), "run.pt")
        torchmagic.Session(model, opt).save(path)
        fresh = models.resnet50(weights=None)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        torchmagic.resume(path, fresh, fresh_opt)
        (guard,) = fresh_opt._optimizer_step_pre_hooks.values()
        fresh(x).sum().backward()
        rows.append(
            ("step guard, after a backward", median_ms(lambda: guard(fresh_opt, (), {}), repeat))
        )
        fresh_opt.zero_grad()
        rows.append(
            ("step guard, no gradients", median_ms(lambda: guard(fresh_opt, (), {}), repeat))
        )
        rows.append(("one AdamW step of resnet50 (context)", step_ms))
        print(f"objects tracked by the collector: {len(gc.get_objects()):,}")
        print(f"| measure | wall ms | CPU ms |  (medians of {repeat})\n| --- | --- | --- |")
        for name, (wall, cpu) in rows:
            print(f"| {name} | {wall:.3f} | {cpu:.3f} |")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
