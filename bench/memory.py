"""Memory: ``%gpumem estimate`` against measured memory, and what ``%freeze`` saves.

Not a test. Run from the repository root::

    .venv/bin/python bench/memory.py [--batch N] [--size PX] [--threads N]

Models are torchvision's with ``weights=None``; the optimizer is ``AdamW(lr=1e-3,
weight_decay=0.05)`` built over all parameters.

1. **Estimate vs measured (CPU)**: resnet50, ``Session(model, opt).freeze("layer1-3")``,
   then ``estimate(model, opt)`` (weights + gradients of the trainable parameters + AdamW
   state: 2 tensors per trainable parameter + the ``step`` scalars), made before any step;
   then one training step (``--batch`` × 3 × ``--size``² input, cross-entropy) and the
   bytes actually held, by walking the tensors (``breakdown``: parameters, ``.grad``,
   ``optimizer.state``). Target: within 5 %.
2. **%freeze vs the naive freeze (CPU)**: resnet50 and AdamW take one step over every
   parameter (state allocated), then layer1-3 are frozen three ways and one more step is
   taken: naive with ``zero_grad()`` (requires_grad only, every parameter left in AdamW),
   naive with ``zero_grad(set_to_none=False)`` (zero gradients stay, so AdamW keeps
   updating the frozen weights), and torchmagic's ``freeze``. Reported: optimizer state
   and gradient bytes held after the step, by walking the tensors.
3. **GPU** (only when ``torch.cuda.is_available()``): the same two comparisons on the GPU
   for resnet50 and vit_b_16 with ``torch.cuda.max_memory_allocated`` (peak of one step,
   activations included, against the estimate with activations from one forward pass at
   the step's input shape), and ``pinbench`` on one 64×3×224×224 batch.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import torchmagic
from torchmagic import Session
from torchmagic.core.devices import hostmem
from torchmagic.core.devices.estimate import estimate
from torchmagic.core.devices.memory import breakdown
from torchmagic.core.devices.pinbench import pinbench
from torchmagic.core.tensors import state_bytes

TARGET_PCT = 5.0
MiB = 2**20


def _adamw(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)


def _step(model: nn.Module, opt: torch.optim.Optimizer, batch: int, size: int, device) -> None:
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    F.cross_entropy(model(x), y).backward()
    opt.step()


def _held(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes, walking the tensors."""
    r = breakdown(model, opt)
    return r.params_trainable + r.params_frozen, r.grads, r.optimizer_state


def _model(name: str, device) -> nn.Module:
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None, num_classes=10).to(device)


def _row(cells: list[str], widths: list[int]) -> str:
    pairs = enumerate(zip(cells, widths, strict=True))
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(_row(header, widths))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(_row(r, widths))


def _mib(n: int) -> str:
    return f"{n / MiB:.2f}"


def estimate_vs_measured(name: str, batch: int, size: int, device) -> bool:
    model = _model(name, device)
    opt = _adamw(model)
    Session(model, opt).freeze("layer1-3")
    model.train()
    est = estimate(model, opt, (batch, 3, size, size))
    predicted = est.weights + est.grads + est.optimizer_state
    rss_before = hostmem.rss() or 0
    peak_reset = hostmem.reset_peak_rss()
    _step(model, opt, batch, size, device)
    rss_peak = hostmem.peak_rss() or 0
    weights, grads, state = _held(model, opt)
    measured = weights + grads + state
    error = 100 * (predicted - measured) / measured
    ok = abs(error) <= TARGET_PCT
    print(f"\n## estimate vs measured: {name} after freeze layer1-3, AdamW, one step ({device})")
    _table(
        ["", "weights MiB", "grads MiB", "state MiB", "total MiB"],
        [
            ["estimate (before the step)"]
            + [_mib(n) for n in (est.weights, est.grads, est.optimizer_state, predicted)],
            ["measured (walk after the step)"]
            + [_mib(n) for n in (weights, grads, state, measured)],
        ],
    )
    print(f"error {error:+.4f} %  (target within {TARGET_PCT:g} %)  {'PASS' if ok else 'FAIL'}")
    print(f"state rule: {est.state_rule}; trainable {est.trainable:,} / frozen {est.frozen:,}")
    if peak_reset:
        allocated = est.grads + est.optimizer_state + est.activations
        print(
            f"context (not a target): the step allocates gradients + state + saved activations "
            f"= {_mib(allocated)} MiB by the estimate (activations {_mib(est.activations)} MiB "
            f"at {batch}×3×{size}×{size}); the process's peak RSS grew by "
            f"{_mib(rss_peak - rss_before)} MiB during it (temporaries and allocator included)"
        )
    return ok


def _freeze_variant(name: str, variant: str, batch: int, size: int, device) -> list[int]:
    model = _model(name, device)
    opt = _adamw(model)
    model.train()
    _step(model, opt, batch, size, device)  # every parameter now has AdamW state
    frozen = [
        p for n, p in model.named_parameters() if n.startswith(("layer1", "layer2", "layer3"))
    ]
    aside = state_bytes(opt, frozen)
    if variant == "torchmagic":
        Session(model, opt).freeze("layer1-3")
        opt.zero_grad()
    else:
        for p in frozen:
            p.requires_grad_(False)
        opt.zero_grad(set_to_none=variant == "naive, zero_grad()")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _step(model, opt, batch, size, device)
    _, grads, state = _held(model, opt)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return [state, grads, aside if variant == "torchmagic" else 0, peak]


def freeze_saving(name: str, batch: int, size: int, device) -> None:
    variants = ["naive, zero_grad()", "naive, zero_grad(set_to_none=False)", "torchmagic"]
    results = {v: _freeze_variant(name, v, batch, size, device) for v in variants}
    naive_state, naive_grads = results[variants[0]][:2]
    print(f"\n## %freeze vs naive freeze: {name}, layer1-3 frozen after one AdamW step ({device})")
    header = ["variant", "state MiB", "grads MiB", "state+grads MiB", "saved vs naive MiB"]
    if device.type == "cuda":
        header.append("peak of next step MiB")
    rows = []
    for v, (state, grads, _, peak) in results.items():
        saved = naive_state + naive_grads - state - grads
        row = [v, _mib(state), _mib(grads), _mib(state + grads), _mib(saved)]
        rows.append(row + ([_mib(peak)] if device.type == "cuda" else []))
    _table(header, rows)
    aside = results["torchmagic"][2]
    where = "moved to host RAM" if device.type == "cuda" else "still in host RAM"
    print(
        f"torchmagic sets the frozen parameters' state aside for %tm undo: {_mib(aside)} MiB, "
        f"{where} (held by the session's history)"
    )


def gpu(batch: int) -> None:
    device = torch.device("cuda", 0)
    print(f"\n# GPU: {torch.cuda.get_device_name(device)}")
    for name, target in (
        ("resnet50", "layer1-3"),
        ("vit_b_16", "encoder.layers.encoder_layer_0-5"),
    ):
        model = _model(name, device)
        opt = _adamw(model)
        Session(model, opt).freeze(target)
        est = estimate(model, opt, (batch, 3, 224, 224))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        model.train()
        _step(model, opt, batch, 224, device)
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated(device)
        peak = torch.cuda.max_memory_allocated(device)
        persistent = est.weights + est.buffers + est.grads + est.optimizer_state
        print(f"\n## {name}, freeze {target}, AdamW, batch {batch}×3×224×224")
        _table(
            ["", "MiB"],
            [
                ["estimate weights+buffers+grads+state", _mib(persistent)],
                ["memory_allocated after the step", _mib(after)],
                ["estimate + saved activations", _mib(est.total)],
                ["max_memory_allocated during the step", _mib(peak)],
            ],
        )
        print(f"error (persistent) {100 * (persistent - after) / after:+.2f} %")
        del model, opt
        torch.cuda.empty_cache()
    freeze_saving("resnet50", batch, 224, device)
    report = pinbench(torch.randn(64, 3, 224, 224), device)
    print("\n## pinbench, one 64×3×224×224 float32 batch")
    _table(
        ["host memory / copy", "ms"],
        [
            ["pageable, blocking", f"{report.pageable_ms:.3f}"],
            ["pageable, non_blocking", f"{report.pageable_non_blocking_ms:.3f}"],
            ["pinned, blocking", f"{report.pinned_ms:.3f}"],
            ["pinned, non_blocking", f"{report.pinned_non_blocking_ms:.3f}"],
            ["pin_memory() itself", f"{report.pin_ms:.3f}"],
        ],
    )
    print(report.advice)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="CPU batch size (default 4)")
    parser.add_argument("--size", type=int, default=224, help="CPU image size (default 224)")
    parser.add_argument("--gpu-batch", type=int, default=64, help="GPU batch size (default 64)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print("# torchmagic memory (bench/memory.py)")
    print(
        f"{hostmem.cpu_name()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
        f"torchmagic {torchmagic.__version__}, Python {platform.python_version()}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    cpu = torch.device("cpu")
    ok = estimate_vs_measured("resnet50", args.batch, args.size, cpu)
    freeze_saving("resnet50", args.batch, args.size, cpu)
    if torch.cuda.is_available():
        gpu(args.gpu_batch)
    else:
        print("\n# GPU: not available here; the GPU section was not run")
    verdict = "PASS" if ok else "FAIL"
    print(f"\n{verdict}: estimate within {TARGET_PCT:g} %; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
