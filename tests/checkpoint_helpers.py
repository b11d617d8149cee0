"""What the checkpoint tests compare: a model and its optimizer by name, exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torchvision
from torch import nn


def structure(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Flags, group members (by name) and every group's hyper-parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "flags": {n: p.requires_grad for n, p in model.named_parameters()},
        "groups": [[names[id(p)] for p in g["params"]] for g in opt.param_groups],
        "hyper": [
            {k: v for k, v in g.items() if k not in ("params", "param_names")}
            for g in opt.param_groups
        ],
        "shapes": {k: tuple(v.shape) for k, v in model.state_dict().items()},
    }


def state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Weights, buffers and optimizer state by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": {
            names[id(p)]: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for p, s in opt.state.items()
            if s
        },
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_same(a: dict, b: dict, what: str = "") -> None:
    for key in a.keys() | b.keys():
        assert key in a and key in b, f"{what}{key} missing on one side"
        if isinstance(a[key], dict) and isinstance(b[key], dict) and not _same(a[key], b[key]):
            assert_same(a[key], b[key], f"{what}{key}.")
        assert _same(a[key], b[key]), f"{what}{key} differs"


def batches(n: int, shape: tuple[int, ...], classes: int, seed: int = 1) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(*shape, generator=gen), torch.randint(0, classes, (shape[0],), generator=gen))
        for _ in range(n)
    ]


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    data: Iterable,
    step_schedulers: Callable[[], None] = lambda: None,
    forward: Callable | None = None,
) -> None:
    """Plain steps: forward, cross entropy, backward, step, zero_grad, the schedulers."""
    model.train()
    for inputs, targets in data:
        out = forward(model, inputs) if forward is not None else model(inputs)
        nn.functional.cross_entropy(out, targets).backward()
        opt.step()
        opt.zero_grad()
        step_schedulers()


def build_resnet18(seed: int = 0):
    """The issue's case: resnet18(num_classes=10), AdamW, cosine — built as a notebook does."""
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
