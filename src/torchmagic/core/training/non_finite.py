"""Non-finite losses found without a host sync per step: the losses since the loop's
last check point, read with one sync, and the BatchNorm running statistics a
non-finite stop puts back (when the loop checks: see ``fit``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..modules import walk


class LossLedger:
    """Each step's loss stays on the device until a check point reads all of them with
    one host sync; the epoch's loss adds up the finite steps before the first bad one."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, torch.Tensor, int]] = []  # (step, loss, samples)
        self.total = 0.0
        self.seen = 0

    def start_epoch(self) -> None:
        self.total, self.seen = 0.0, 0

    def add(self, step: int, loss: torch.Tensor, samples: int) -> None:
        """One batch's loss, for the optimizer step ``step`` it is part of."""
        self.pending.append((step, loss, samples))

    def settle(self) -> tuple[int, float] | None:
        """(step, loss) of the first non-finite loss since the last check, else None."""
        if not self.pending:
            return None
        values = torch.stack([loss.float() for _, loss, _ in self.pending]).tolist()
        pending = [(step, n) for step, _, n in self.pending]
        self.pending.clear()
        for (step, n), value in zip(pending, values, strict=True):
            if value != value or value in (float("inf"), float("-inf")):
                return step, value
            self.total += value * n
            self.seen += n
        return None

    @property
    def epoch_loss(self) -> float:
        return self.total / self.seen if self.seen else float("nan")


class BatchNormSnapshot:
    """The running statistics of every BatchNorm as they were at the last check point
    whose losses were all finite, and before the batch in flight (a few KB to MB each:
    copied on the device): a step that raises leaves no statistics of its batch."""

    def __init__(self, model: nn.Module) -> None:
        self.live = [
            buffer
            for m in walk(model)
            if isinstance(m, _BatchNorm) and m.track_running_stats
            for buffer in m.buffers(recurse=False)
        ]
        self.saved = [b.detach().clone() for b in self.live]
        self.before_batch = [b.detach().clone() for b in self.live]
        self.step = 0

    def take(self, step: int) -> None:
        if self.live:
            torch._foreach_copy_(self.saved, self.live)
        self.step = step

    def restore(self) -> None:
        if self.live:
            with torch.no_grad():
                torch._foreach_copy_(self.live, self.saved)

    def take_batch(self) -> None:
        if self.live:
            torch._foreach_copy_(self.before_batch, self.live)

    def restore_batch(self) -> None:
        if self.live:
            with torch.no_grad():
                torch._foreach_copy_(self.live, self.before_batch)


def count_non_finite(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    """(tensors holding NaN/inf, tensors looked at): read once, at a stop."""
    checked = [t for t in tensors if t.is_floating_point()]
    return sum(not bool(torch.isfinite(t).all()) for t in checked), len(checked)
