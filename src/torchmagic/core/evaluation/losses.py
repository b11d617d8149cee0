"""Each sample's own loss, for the largest losses: the losses ``fit`` knows by name and a
loss module with a ``reduction`` give it with ``reduction="none"``; another callable is
called one sample at a time (only when the worst samples are asked for)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import torch
from torch import nn

from ..training.fit_plan import LOSSES


def per_sample(loss_fn: Callable) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """``loss_fn`` giving one loss per sample (averaged over any other dimension), or
    None when it cannot be asked to."""
    if loss_fn in LOSSES.values():
        unreduced: Callable = functools.partial(loss_fn, reduction="none")
    elif isinstance(loss_fn, nn.Module) and isinstance(getattr(loss_fn, "reduction", None), str):
        unreduced = copy.copy(loss_fn)  # a copy: the user's keeps its reduction
        setattr(unreduced, "reduction", "none")  # noqa: B010  # torch types it as a tensor
    else:
        return None

    def each(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        values = unreduced(output, targets)
        return values.flatten(1).mean(dim=1) if values.ndim > 1 else values

    return each
