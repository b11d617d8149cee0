"""%evaluate's throughput against the hand-written eval loop on the same loader.

Not a test. Run from the repository root::

    .venv/bin/python bench/evaluate.py [--model resnet18] [--samples 1024] [--batch 128]
        [--size 64] [--repeat 5] [--device cpu|cuda] [--amp]

The hand loop is what a careful user writes: ``model.eval()``, ``torch.inference_mode()``,
each batch to the device, the summed cross-entropy and the correct count, read once at the
end. Ours is ``%evaluate model val_loader`` as a whole line magic in an InteractiveShell
(engine, torchmetrics' per-class metrics and confusion matrix, rendering both MIME types),
and ``%evaluate … --worst 16`` (the bounded heap: one small copy a batch). Both read one
in-memory loader of random images (torchvision, ``weights=None``), so the loader costs the
same to each. Prints the median samples/s of each, the ratio ours / hand, and PASS when
the plain ``%evaluate`` is at least 0.95x the hand loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from machine import describe
from torch.utils.data import DataLoader, TensorDataset
from torchvision import models

TARGET = 0.95


def hand_loop(model: torch.nn.Module, loader: DataLoader, device: torch.device, amp: bool):
    model.eval()
    total = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    seen = 0
    with torch.inference_mode(), torch.autocast(device.type, enabled=amp):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            out = model(x).float()
            total += torch.nn.functional.cross_entropy(out, y, reduction="sum")
            correct += (out.argmax(1) == y).sum()
            seen += len(y)
    return float(total) / seen, int(correct) / seen


def timed(runs: dict[str, Callable[[], object]], repeat: int, sync: Callable[[], None]):
    """Seconds of each run, ``repeat`` times, interleaved so that a busy machine slows
    each of them alike; one untimed warm-up each first (imports, kernels, allocator)."""
    for run in runs.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            run()
            sync()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast in both loops")
    args = parser.parse_args()
    device = torch.device(args.device)
    say(describe())
    say(f"device {device}{' (bf16 autocast)' if args.amp else ''}")

    torch.manual_seed(0)
    model = getattr(models, args.model)(weights=None, num_classes=10).to(device)
    images = torch.randn(args.samples, 3, args.size, args.size)
    labels = torch.randint(0, 10, (args.samples,))
    loader = DataLoader(
        TensorDataset(images, labels), batch_size=args.batch, pin_memory=device.type == "cuda"
    )

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "torchmagic")
    shell.user_ns.update(model=model, val_loader=loader)
    if args.amp:
        shell.run_line_magic("amp", "on bf16")

    def magic(line: str) -> Callable[[], object]:
        def run() -> object:
            with capture_output():
                result = shell.run_cell(line)
            result.raise_error()
            return result

        return run

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    seconds = timed(
        {
            "hand-written eval loop": lambda: hand_loop(model, loader, device, args.amp),
            "%evaluate": magic("%evaluate model val_loader"),
            "%evaluate --worst 16": magic("%evaluate model val_loader --worst 16"),
        },
        args.repeat,
        sync,
    )
    hand_loss, hand_acc = hand_loop(model, loader, device, args.amp)
    with capture_output():
        shell.run_cell("%evaluate model val_loader --as ev").raise_error()
    ev = shell.user_ns["ev"]
    say(
        f"same numbers: loss {ev.loss:.6f} vs {hand_loss:.6f}, accuracy {ev.accuracy} vs {hand_acc}"
    )
    say(f"{args.model}, {args.samples} samples of 3x{args.size}x{args.size}, batch {args.batch}")
    say(f"{'':26}{'median s':>10}{'samples/s':>12}{'vs hand':>9}")
    hand = args.samples / statistics.median(seconds["hand-written eval loop"])
    for name, times in seconds.items():
        rate = args.samples / statistics.median(times)
        say(f"{name:26}{statistics.median(times):10.4f}{rate:12.1f}{rate / hand:8.3f}x")
    ratio = args.samples / statistics.median(seconds["%evaluate"]) / hand
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    say(f"%evaluate >= {TARGET}x the hand loop: {verdict} ({ratio:.3f}x)")


def say(line: str) -> None:
    """Print where the terminal is (the shell's display hooks may hold ``sys.stdout``)."""
    print(line, file=sys.__stdout__, flush=True)


if __name__ == "__main__":
    main()
