"""Does ``pin_memory`` pay for this loader? Time one real batch's host→GPU copy.

Four ways are measured: pageable or pinned host memory, copied with ``non_blocking``
False or True, plus the cost of pinning itself (what ``DataLoader(pin_memory=True)``
spends in its pin thread). Without CUDA there is nothing to measure and nothing is done:
the loader is not even iterated.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..errors import TorchMagicError
from ..tensors import leaves, total_bytes
from .device import cuda_note

# Pinning is recommended when the pinned non_blocking copy is this much faster ...
MIN_SPEEDUP = 1.2
# ... and saves at least this many milliseconds per batch.
MIN_SAVED_MS = 0.05


@dataclass(frozen=True)
class PinReport:
    """Median milliseconds per batch; ``ran`` False with ``reason`` when nothing was done."""

    ran: bool
    reason: str
    device: str = ""
    batch_bytes: int = 0
    tensors: int = 0
    pageable_ms: float = 0.0
    pageable_non_blocking_ms: float = 0.0
    pinned_ms: float = 0.0
    pinned_non_blocking_ms: float = 0.0
    pin_ms: float = 0.0  # pin_memory() of the batch, paid by the loader's pin thread
    repeats: int = 0
    loader_pins: bool | None = None  # the loader's own pin_memory setting, when it has one
    speedup: float = 0.0  # pageable blocking / pinned non_blocking
    recommend: bool = False
    advice: str = ""


def _is_batch(source: object) -> bool:
    return isinstance(source, (torch.Tensor, list, tuple, dict))


def _median_ms(copy: Callable[[], object], repeats: int) -> float:
    copy()  # warm-up: allocator, first-touch
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        copy()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def pinbench(
    source: object, device: str | torch.device | None = None, repeats: int = 20
) -> PinReport:
    """Time host→``device`` copies of one batch of ``source`` (a DataLoader, any iterable
    of batches, or a batch: tensor, or list/tuple/dict of tensors)."""
    if not torch.cuda.is_available():
        return PinReport(
            ran=False,
            reason=f"no CUDA device ({cuda_note()}): pinned memory only speeds up host→GPU "
            "copies, so there is nothing to measure; nothing was done",
        )
    target = torch.device(device) if device is not None else torch.device("cuda")
    if target.type != "cuda":
        raise TorchMagicError(
            f"pinbench measures copies to a CUDA device, and the device is {target}; "
            "choose a CUDA device",
            param="device",
        )
    if repeats < 1:
        raise TorchMagicError(f"repeats must be at least 1, got {repeats}", param="repeats")
    loader_pins = getattr(source, "pin_memory", None)
    if _is_batch(source):
        batch = source
    elif isinstance(source, Iterable):
        batch = next(iter(source))
    else:
        raise TorchMagicError(
            f"expected a DataLoader, an iterable of batches or a batch, got "
            f"{type(source).__name__}",
            param="source",
        )
    # pageable copies, even when the loader already pinned (or the data lives on a GPU)
    tensors = [t.detach().cpu().clone() for t in leaves(batch)]
    if not tensors:
        raise TorchMagicError(
            f"the batch is a {type(batch).__name__} with no tensors to copy", param="source"
        )

    def copy(ts: list[torch.Tensor], non_blocking: bool) -> Callable[[], object]:
        return lambda: [t.to(target, non_blocking=non_blocking) for t in ts]

    pin_times = []
    pinned = tensors
    for _ in range(max(1, repeats // 4)):
        start = time.perf_counter()
        pinned = [t.pin_memory() for t in tensors]
        pin_times.append((time.perf_counter() - start) * 1e3)
    pin_ms = statistics.median(pin_times)
    pageable_ms = _median_ms(copy(tensors, False), repeats)
    pinned_non_blocking_ms = _median_ms(copy(pinned, True), repeats)
    speedup = pageable_ms / pinned_non_blocking_ms if pinned_non_blocking_ms else 0.0
    saved = pageable_ms - pinned_non_blocking_ms
    recommend = speedup >= MIN_SPEEDUP and saved >= MIN_SAVED_MS
    if recommend:
        advice = (
            f"use pin_memory=True and .to(device, non_blocking=True): the copy is "
            f"{speedup:.1f}x faster ({saved:.2f} ms saved per batch); pinning costs "
            f"{pin_ms:.2f} ms in the loader's pin thread, off the training loop"
        )
    else:
        advice = (
            f"pinning does not pay here ({speedup:.2f}x, {saved:.2f} ms per batch, "
            f"pinning itself {pin_ms:.2f} ms): keep pin_memory=False"
        )
    return PinReport(
        ran=True,
        reason="",
        device=str(target),
        batch_bytes=total_bytes(tensors),
        tensors=len(tensors),
        pageable_ms=pageable_ms,
        pageable_non_blocking_ms=_median_ms(copy(tensors, True), repeats),
        pinned_ms=_median_ms(copy(pinned, False), repeats),
        pinned_non_blocking_ms=pinned_non_blocking_ms,
        pin_ms=pin_ms,
        repeats=repeats,
        loader_pins=loader_pins if isinstance(loader_pins, bool) else None,
        speedup=speedup,
        recommend=recommend,
        advice=advice,
    )
