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
3. **GPU** (only when ``torch.cuda.is_available()``; ``--gpu-only`` for just this):
   the predicted peak of a whole step (``estimate(..., input_shape, amp_dtype=...).peak``)
   against ``torch.cuda.max_memory_allocated`` of a real step (after a first step, so the
   optimizer state exists) for resnet50 (layer1-3 frozen) and vit_b_16 (encoder layers
   0-5 frozen), AdamW, batch 32 and 128, fp32 and bf16 autocast; target within 10 %.
   Then ``find_batch_size`` (resnet50, bf16, 3×224×224) against a binary search of real
   out-of-memory errors (doubling, then bisecting, as Lightning's ``Tuner.scale_batch_size``
   does): answer, steps and seconds. Then %freeze vs naive on the GPU and ``pinbench``.
   Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import torchmagic
from torchmagic import Session
from torchmagic.core.devices import hostmem
from torchmagic.core.devices.batch_size import find_batch_size
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


PEAK_TARGET_PCT = 10.0
GPU_MODELS = (("resnet50", "layer1-3"), ("vit_b_16", "encoder.layers.encoder_layer_0-5"))


def _real_step(model, opt, batch: int, size: int, device, amp_dtype) -> None:
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def peak_vs_measured(device, batches: tuple[int, ...]) -> bool:
    """The predicted peak of a whole step against max_memory_allocated of a real one."""
    print("\n## %gpumem estimate: predicted peak vs max_memory_allocated of a real step")
    rows, ok = [], True
    for name, frozen in GPU_MODELS:
        for amp_dtype in (None, torch.bfloat16):
            for batch in batches:
                model = _model(name, device)
                opt = _adamw(model)
                Session(model, opt).freeze(frozen)
                model.train()
                _real_step(model, opt, batch, 224, device, amp_dtype)  # state, kernels
                est = estimate(model, opt, (batch, 3, 224, 224), amp_dtype=amp_dtype)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                _real_step(model, opt, batch, 224, device, amp_dtype)
                torch.cuda.synchronize()
                measured = torch.cuda.max_memory_allocated(device)
                peak = est.peak
                error = 100 * (peak.total - measured) / measured
                ok &= abs(error) <= PEAK_TARGET_PCT
                rows.append(
                    [
                        f"{name} {'bf16' if amp_dtype else 'fp32'} b{batch}",
                        _mib(est.persistent),
                        _mib(peak.saved_activations),
                        _mib(peak.activation_grads),
                        _mib(peak.optimizer_temporaries or 0),
                        f"{peak.phase}",
                        _mib(peak.total),
                        _mib(measured),
                        f"{error:+.1f} %",
                    ]
                )
                del model, opt
                torch.cuda.empty_cache()
    _table(
        [
            "model, precision, batch",
            "persistent MiB",
            "saved act. MiB",
            "act. grads MiB",
            "opt. temp. MiB",
            "peak phase",
            "predicted peak MiB",
            "measured peak MiB",
            "error",
        ],
        rows,
    )
    print(f"target: within {PEAK_TARGET_PCT:g} %  {'PASS' if ok else 'FAIL'}")
    return ok


def _oom_binary_search(model, opt, size: int, device) -> tuple[int, int]:
    """(largest batch, steps run) by doubling until a real OOM, then bisecting (as
    Lightning's Tuner.scale_batch_size does); state restored by the caller's copy."""
    steps, low, high = 0, 0, 2

    def fits(batch: int) -> bool:
        nonlocal steps
        steps += 1
        try:
            _real_step(model, opt, batch, size, device, torch.bfloat16)
            return True
        except torch.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            return False

    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, steps


def batch_size_vs_oom_search(device) -> bool:
    """find_batch_size against a binary search of real OOMs: answer and time."""
    print("\n## %gpumem batch: measured line + one confirming step vs binary search of OOMs")
    model = _model("resnet50", device)
    opt = _adamw(model)
    _real_step(model, opt, 2, 224, device, torch.bfloat16)
    start = time.perf_counter()
    report = find_batch_size(model, opt, (3, 224, 224), amp_dtype=torch.bfloat16)
    ours = time.perf_counter() - start
    torch.cuda.empty_cache()
    start = time.perf_counter()
    searched, steps = _oom_binary_search(model, opt, 224, device)
    theirs = time.perf_counter() - start
    points = ", ".join(f"{p.batch}: {_mib(p.step_bytes)} MiB" for p in report.points)
    _table(
        ["method", "batch", "steps", "s"],
        [
            [
                "find_batch_size",
                str(report.batch),
                str(len(report.points) + 2 + report.backoffs),
                f"{ours:.1f}",
            ],
            ["binary search of real OOMs", str(searched), str(steps), f"{theirs:.1f}"],
        ],
    )
    print(f"probes {points}; {report.per_sample_bytes / MiB:.1f} MiB per sample")
    ok = ours < theirs and report.batch <= searched
    print(f"faster and never above the OOM search's answer: {'PASS' if ok else 'FAIL'}")
    del model, opt
    torch.cuda.empty_cache()
    return ok


def gpu(batches: tuple[int, ...]) -> bool:
    device = torch.device("cuda", 0)
    print(f"\n# GPU: {torch.cuda.get_device_name(device)}")
    ok = peak_vs_measured(device, batches)
    ok &= batch_size_vs_oom_search(device)
    freeze_saving("resnet50", batches[0], 224, device)
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
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="CPU batch size (default 4)")
    parser.add_argument("--size", type=int, default=224, help="CPU image size (default 224)")
    parser.add_argument(
        "--gpu-batches",
        default="32,128",
        help="GPU batch sizes for the peak comparison (default 32,128)",
    )
    parser.add_argument(
        "--gpu-only", action="store_true", help="only the GPU section (tools/gpu_check.py)"
    )
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
    ok = True
    if not args.gpu_only:
        cpu = torch.device("cpu")
        ok = estimate_vs_measured("resnet50", args.batch, args.size, cpu)
        freeze_saving("resnet50", args.batch, args.size, cpu)
    if torch.cuda.is_available():
        ok &= gpu(tuple(int(b) for b in args.gpu_batches.split(",")))
    else:
        print("\n# GPU: not available here; the GPU section was not run")
    verdict = "PASS" if ok else "FAIL"
    print(f"\n{verdict}: memory targets met; {time.perf_counter() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
