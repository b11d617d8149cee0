"""Export for inference: ``Session.export(path)`` against the same file written by hand.

Not a test. Run from the repository root::

    .venv/bin/python bench/export.py [--models resnet18,resnet50] [--formats pt2,safetensors]
        [--repeat 5] [--side 64]

Per model (torchvision, ``weights=None``, 10 classes, ``layer1`` frozen with BatchNorm held
in eval, so the session has hooks to strip) and format, the MEDIAN wall time (s) of

* ours: ``tm.export(path, input_shape=(1, 3, S, S))``: the inference copy (deep copy,
  BatchNorm in eval, hooks removed), the write under a temporary name, the read back, the
  probe's forward on the live model and on the file, the rename;
* by hand: what a user writes without it for the same file: a deep copy in eval mode, then
  ``torch.export.export`` with a dynamic batch and ``torch.export.save`` (``.pt2``), or
  ``safetensors.torch.save_file`` of the state dict (``.safetensors``), with no check;

and the ratio ours / by hand. The difference is the verification (a load and two forwards
of a batch of 3), which the hand-written export leaves out. Ours and by hand alternate, so
both meet the same load.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from machine import describe
from torchvision import models

import torchmagic


def by_hand(model: torch.nn.Module, fmt: str, path: str, side: int) -> None:
    twin = copy.deepcopy(model).eval()
    if fmt == "pt2":
        batch = torch.export.Dim("batch", min=1)
        example = torch.randn(2, 3, side, side)
        program = torch.export.export(twin, (example,), dynamic_shapes=({0: batch},))
        torch.export.save(program, path)
    else:
        from safetensors.torch import save_file

        save_file(twin.state_dict(), path)


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def medians(
    tm: torchmagic.Session, model: torch.nn.Module, fmt: str, folder: str, side: int, repeat: int
) -> tuple[float, float]:
    """(ours, by hand), median seconds, alternating."""
    ours_path, hand_path = os.path.join(folder, f"ours.{fmt}"), os.path.join(folder, f"hand.{fmt}")
    ours, hand = [], []
    for _ in range(repeat):
        ours.append(timed(lambda: tm.export(ours_path, input_shape=(1, 3, side, side), force=True)))
        hand.append(timed(lambda: by_hand(model, fmt, hand_path, side)))
    return statistics.median(ours), statistics.median(hand)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--formats", default="pt2,safetensors")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--side", type=int, default=64)
    args = parser.parse_args()
    print(describe())
    print(f"{'model':<10} {'format':<12} {'ours s':>8} {'by hand s':>10} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            model = models.get_model(name, weights=None, num_classes=10)
            tm = torchmagic.Session(model)
            tm.freeze("layer1")
            for fmt in args.formats.split(","):
                o, h = medians(tm, model, fmt, folder, args.side, args.repeat)
                print(f"{name:<10} {fmt:<12} {o:>8.2f} {h:>10.2f} {o / h:>6.2f}")


if __name__ == "__main__":
    main()
