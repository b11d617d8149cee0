"""Meta-device replicas: a copy of a model whose parameters and buffers are shapes
without memory, so a forward pass on it costs no memory and no arithmetic and leaves the
model, its statistics and the RNG as they were. The step estimate and the summary's
output shapes run on one."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .errors import TorchMagicError


def refuse_lazy(model: nn.Module, what: str) -> None:
    """Lazy modules have no shapes until a real forward: ``what`` cannot run without one."""
    if any(is_lazy(t) for t in (*model.parameters(), *model.buffers())):
        raise TorchMagicError(
            "the model has lazy modules that are not initialised yet: run one forward pass "
            f"on a real batch first ({what} never runs one that would change the model)",
            param="model",
        )


def meta_replica(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers live on the meta device (in
    ``dtype`` when given): shapes, no memory. The model itself is not touched."""
    memo: dict[int, object] = {}
    for t in (*model.parameters(), *model.buffers()):
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
        meta = torch.empty(t.shape, dtype=cast, device="meta")
        memo[id(t)] = (
            nn.Parameter(meta, requires_grad=t.requires_grad)
            if isinstance(t, nn.Parameter)
            else meta
        )
    return copy.deepcopy(model, memo)


def compute_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the model computes in: its first floating-point parameter's."""
    floating = [p for p in model.parameters() if p.is_floating_point()]
    return floating[0].dtype if floating else torch.get_default_dtype()
