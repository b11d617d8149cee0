"""LoRA: optimizer-state bytes and step time of ``%lora`` r=8 against full fine-tuning,
head-only training and peft's own ``get_peft_model`` (the hand-written equivalent).

Not a test. Run from the repository root::

    .venv/bin/python bench/lora.py [--size 64] [--batch 8] [--repeat 7] [--threads 1]

torchvision's ``vit_b_16`` (``weights=None``, ``image_size=--size``), AdamW(lr=1e-3), on the
CPU. Four setups, each on a fresh model:

- **full**: every parameter trains;
- **head only**: ``Session.freeze(exclude=["heads"])``;
- **%lora**: the same freeze, then ``Session.lora("encoder.layers.*.mlp.0",
  "encoder.layers.*.mlp.3", r=8)`` (torchvision's ViT attention is one
  ``nn.MultiheadAttention``, whose projections are not Linear layers it calls);
- **peft**: ``get_peft_model`` with the same targets, r and alpha and
  ``modules_to_save=["heads"]``, and a new AdamW over what trains.

For each: the optimizer-state bytes after the first step (walking ``optimizer.state``) and
the median time of ``--repeat`` training steps (forward, cross-entropy, backward, step) after
two warm-up steps. Ratios are against full fine-tuning, and %lora against peft.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from machine import describe  # noqa: E402

from torchmagic import Session  # noqa: E402
from torchmagic.core.tensors import state_bytes  # noqa: E402

TARGETS = ("encoder.layers.*.mlp.0", "encoder.layers.*.mlp.3")
MiB = 2**20


def _vit(size: int) -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.vit_b_16(weights=None, image_size=size, num_classes=10)


def _adamw(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def full(size: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _vit(size)
    return model, _adamw(model)


def head_only(size: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _vit(size)
    opt = _adamw(model)
    Session(model, opt).freeze(exclude=["heads"])
    return model, opt


def with_lora(size: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _vit(size)
    opt = _adamw(model)
    tm = Session(model, opt)
    tm.freeze(exclude=["heads"])
    tm.lora(*TARGETS, r=8, alpha=16)
    return model, opt


def with_peft(size: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    import peft

    names = [n for n, m in _vit(size).named_modules() if n.endswith(("mlp.0", "mlp.3")) and n]
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=names, modules_to_save=["heads"])
    model = peft.get_peft_model(_vit(size), config)
    return model, _adamw(model)


def measure(
    build: Callable[[int], tuple[nn.Module, torch.optim.Optimizer]],
    size: int,
    batch: int,
    repeat: int,
) -> tuple[int, float, int]:
    """(optimizer-state bytes after one step, median step seconds, trainable params)."""
    model, opt = build(size)
    model.train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)

    def step() -> None:
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    state = state_bytes(opt, list(opt.state))
    step()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return state, statistics.median(times), trainable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe())
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"vit_b_16 at {args.size} px, batch {args.batch}, AdamW, median of {args.repeat} steps")
    setups = {"full": full, "head only": head_only, "%lora r=8": with_lora, "peft r=8": with_peft}
    results = {
        name: measure(build, args.size, args.batch, args.repeat) for name, build in setups.items()
    }
    base_state, base_time, _ = results["full"]
    print()
    print("| setup | trainable | optimizer state | vs full | step (median) | vs full |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, (state, seconds, trainable) in results.items():
        print(
            f"| {name} | {trainable / 1e6:.2f}M | {state / MiB:.1f} MiB | "
            f"{state / base_state:.4f}x | {seconds * 1e3:.0f} ms | {seconds / base_time:.2f}x |"
        )
    ours, theirs = results["%lora r=8"], results["peft r=8"]
    print()
    print(
        f"%lora vs peft's get_peft_model: state {ours[0] / theirs[0]:.3f}x, "
        f"step time {ours[1] / theirs[1]:.2f}x"
    )


if __name__ == "__main__":
    main()
