"""Exact snapshots of a model and its optimizer, to assert that nothing changed."""

from __future__ import annotations

import torch
from torch import nn


def _clone(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    snap = {
        "params": [
            (n, id(p), p.requires_grad, p.detach().clone()) for n, p in model.named_parameters()
        ],
        "buffers": [(n, b.detach().clone()) for n, b in model.named_buffers()],
        "modules": [
            (n, id(m), m.training, tuple(m._forward_pre_hooks.values()))
            for n, m in model.named_modules()
        ],
    }
    if optimizer is not None:
        snap["groups"] = [
            (
                tuple(id(p) for p in g["params"]),
                {k: _clone(v) for k, v in g.items() if k != "params"},
            )
            for g in optimizer.param_groups
        ]
        snap["state"] = {
            id(p): {k: _clone(v) for k, v in s.items()} for p, s in optimizer.state.items()
        }
    return snap


def equal(a, b) -> bool:
    """Exactly equal: tensors by dtype, device and value; containers item by item."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.device == b.device
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_same(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        assert equal(before[key], after[key]), f"{key} differs"
