"""Did a change help? Two evaluations of the same samples compared pair by pair: the change
in accuracy, the samples each one got right that the other did not, and McNemar's exact
test on those discordant pairs (a two-sided binomial test with p = 1/2)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from ..errors import TorchMagicError

CLEAR_GAIN = 0.05  # the p-value under which a change reads as a clear one


@dataclass(frozen=True)
class Comparison:
    """This evaluation against an earlier one on the same samples. ``accuracy_change``
    as a fraction (0.021: 2.1 points); ``fixed``: wrong before, right now; ``broken``:
    right before, wrong now; ``p_value``: McNemar's exact test on fixed vs broken."""

    accuracy_change: float
    fixed: int
    broken: int
    p_value: float

    @property
    def clear(self) -> bool:
        """The change is unlikely to be chance alone (p below ``CLEAR_GAIN``)."""
        return self.p_value < CLEAR_GAIN


def fingerprint(targets: torch.Tensor) -> str:
    """The targets in order, hashed: two evaluations saw the same samples only if equal."""
    data = targets.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def mcnemar_exact(fixed: int, broken: int) -> float:
    """Two-sided exact binomial p-value of ``min(fixed, broken)`` in ``fixed + broken``
    trials at p = 1/2 (1.0 when no sample changed)."""
    n = fixed + broken
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(fixed, broken) + 1))
    return min(1.0, 2 * tail / 2**n)


def compare(
    correct: torch.Tensor,
    targets_fingerprint: str,
    before_correct: torch.Tensor,
    before_fingerprint: str,
) -> Comparison:
    """``correct`` (one bool per sample, in the loader's order) against the earlier
    ``before_correct``; refused in one line when they saw different samples."""
    if len(correct) != len(before_correct):
        raise TorchMagicError(
            f"against= saw {len(before_correct)} samples and this evaluation {len(correct)}: "
            "compare evaluations of the same loader",
            param="against",
        )
    if targets_fingerprint != before_fingerprint:
        raise TorchMagicError(
            "against= saw other samples (the targets differ in order): compare evaluations "
            "of the same loader, without shuffling",
            param="against",
        )
    fixed = int((correct & ~before_correct).sum())
    broken = int((~correct & before_correct).sum())
    n = len(correct)
    change = (int(correct.sum()) - int(before_correct.sum())) / n if n else 0.0
    return Comparison(change, fixed, broken, mcnemar_exact(fixed, broken))
