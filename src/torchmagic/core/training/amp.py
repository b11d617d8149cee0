"""Mixed precision that picks itself: the autocast dtype per device, the GradScaler that
fp16 needs (and bf16 does not), and one correct training step for hand-written loops,
with gradient accumulation and clipping.

The step: (scaled) backward → [every ``accumulate`` micro-batches:] unscale (fp16) →
clip the total gradient norm of the optimizer's parameters → step → scaler update →
zero_grad. With ``accumulate=N`` each micro-batch's loss is divided by N before its
backward (the gradients add up to the mean over the window, as in Lightning's
``accumulate_grad_batches`` and fastai's ``GradientAccumulation``); a window closed
early (``last``: the epoch's last batch) steps on what it holds, still divided by N.
Clipping comes after unscaling, so ``clip`` is a bound on the true gradient norm.

Only ``torch.autocast`` and ``torch.amp.GradScaler`` are used — never the deprecated
``torch.cuda.amp`` spellings, never ``model.half()``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..choices import MODES
from ..errors import TorchMagicError
from ..tensors import optimizer_params
from .counts import check_ceiling

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


# CPU feature flags (Linux /proc/cpuinfo) of instructions that compute in bf16 natively.
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
CPUINFO = "/proc/cpuinfo"


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16, AMX, Arm BF16). Without it
    CPU autocast emulates bf16 and is usually slower than fp32. Where the flags cannot be
    read, torch's CPU capability decides (AMX means bf16), else it is assumed."""
    try:
        with open(CPUINFO, encoding="ascii", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return not _BF16_FLAGS.isdisjoint(value.split())
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability().upper()
    return "AMX" in capability or not capability.startswith("AVX")


def emulated_bf16(device_type: str) -> bool:
    """bf16 autocast here would be emulated: a CPU without native bf16 instructions."""
    return device_type == "cpu" and not cpu_has_native_bf16()


def keeps_fp32(device_type: str, mode: str) -> bool:
    """``auto`` on a CPU that would emulate bf16: fp32 is faster, so no autocast."""
    return mode == "auto" and emulated_bf16(device_type)


# Why ``auto`` keeps fp32 on such a CPU, and the warning when bf16 is asked for there.
_EMULATED = "this CPU has no native bf16 instructions (avx512_bf16 / amx_bf16)"
KEPT_FP32_REASON = f"fp32 is kept, as {_EMULATED}"
KEPT_FP32 = "emulated bf16 autocast is slower than fp32; ask for bf16 explicitly to use it anyway"
SLOWER_BF16 = f"{_EMULATED}: bf16 autocast is emulated and will likely be slower than fp32"


def supports_bf16(device_type: str) -> bool:
    """Whether autocast in bf16 is worth it on this device type (never initialises CUDA
    when no GPU is present: ``is_available`` is checked first)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device_type in ("cpu", "mps", "xpu")


def choose_dtype(device_type: str, mode: str = "auto") -> torch.dtype:
    """``auto``: bf16 where the device supports it, else fp16 on CUDA; on the CPU bf16.

    fp16 on the CPU is refused: CPU autocast in fp16 is slow and needs loss scaling that
    CPU training does not otherwise use; bf16 has the same range as fp32.
    """
    if mode not in MODES:
        raise TorchMagicError(
            f"unknown precision '{mode}': choose one of {', '.join(MODES)}", param="mode"
        )
    if mode == "fp16" and device_type == "cpu":
        raise TorchMagicError(
            "fp16 autocast on the CPU is refused (slow, and it would need a GradScaler); "
            "use bf16 instead",
            param="mode",
        )
    if mode == "auto":
        return torch.bfloat16 if supports_bf16(device_type) else torch.float16
    if mode == "bf16" and not supports_bf16(device_type):
        raise TorchMagicError(
            f"this {device_type} device has no bf16 support; use fp16", param="mode"
        )
    return _DTYPES[mode]


@dataclass(frozen=True)
class AmpStatus:
    enabled: bool
    dtype: str | None
    device_type: str
    scaler: bool
    scale: float | None
    note: str = ""
    reason: str = ""  # why the policy is what was not asked for: the title says it


class AmpController:
    """The session's precision policy and, for fp16, its GradScaler.

    Turning AMP off keeps the scaler's ``state_dict``; turning fp16 on again loads it into
    the new scaler, so the loss scale found so far is not lost.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.dtype: torch.dtype | None = None
        self.device_type = "cpu"
        self.scaler: torch.amp.GradScaler | None = None
        self._scaler_state: dict | None = None

    def turn_on(self, device_type: str, mode: str = "auto") -> AmpStatus:
        """Autocast on ``device_type``; ``auto`` on a CPU that would emulate bf16 keeps
        fp32 (AMP off) and says why."""
        dtype = choose_dtype(device_type, mode)
        self._park_scaler()
        if keeps_fp32(device_type, mode):
            self.enabled, self.dtype, self.device_type = False, None, device_type
            return self.status(KEPT_FP32, reason=KEPT_FP32_REASON)
        self.enabled, self.dtype, self.device_type = True, dtype, device_type
        note = SLOWER_BF16 if dtype == torch.bfloat16 and emulated_bf16(device_type) else ""
        if dtype == torch.float16:
            self.scaler = torch.amp.GradScaler(device_type)
            if self._scaler_state:
                self.scaler.load_state_dict(self._scaler_state)
            note = "fp16 needs loss scaling: a GradScaler is bound to the session"
        return self.status(note)

    def turn_off(self) -> AmpStatus:
        self._park_scaler()
        self.enabled, self.dtype = False, None
        kept = "the GradScaler's state is kept for next time" if self._scaler_state else ""
        return self.status(kept)

    def _park_scaler(self) -> None:
        if self.scaler is not None:
            self._scaler_state = self.scaler.state_dict()
            self.scaler = None

    def status(self, note: str = "", reason: str = "") -> AmpStatus:
        scale = None
        if self.scaler is not None and self.scaler.is_enabled():
            scale = float(self.scaler.get_scale())
        return AmpStatus(
            enabled=self.enabled,
            dtype=_NAMES.get(self.dtype) if self.dtype is not None else None,
            device_type=self.device_type,
            scaler=self.scaler is not None,
            scale=scale,
            note=note,
            reason=reason,
        )

    def autocast(self, dtype: torch.dtype | None = None, device_type: str | None = None):
        """The forward-and-loss context: autocast when AMP is on (or a dtype is given)."""
        if dtype is None and not self.enabled:
            return nullcontext()
        return torch.autocast(
            device_type=device_type or self.device_type, dtype=dtype or self.dtype
        )

    @property
    def active_scaler(self) -> torch.amp.GradScaler | None:
        """The GradScaler a step uses now: the session's, while fp16 is on."""
        return self.scaler if self.enabled else None

    def step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> bool:
        """backward → (unscale) step → scaler update → zero_grad, outside autocast.

        Returns whether the optimizer stepped. With nothing trainable (no gradient reached
        any parameter of the optimizer) the scaler is skipped: ``GradScaler.step`` refuses
        an optimizer without recorded inf checks.
        """
        return scaled_step(loss, optimizer, self.active_scaler)


def check_accumulate(accumulate: object) -> int:
    """``accumulate``: micro-batches per optimizer step, a whole number ≥ 1."""
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise TorchMagicError(
            f"accumulate must be a whole number of batches ≥ 1, got {accumulate!r}",
            param="accumulate",
        )
    check_ceiling(accumulate, "accumulate")
    return accumulate


def check_clip(clip: object) -> float | None:
    """``clip``: the largest total gradient norm, a positive finite number (None: no clip)."""
    if clip is None:
        return None
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not (0 < clip < math.inf):
        raise TorchMagicError(f"clip must be a positive gradient norm, got {clip!r}", param="clip")
    return float(clip)


def clip_gradients(
    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None, max_norm: float
) -> torch.Tensor:
    """Unscale (fp16: so the norm is the true one), then scale the gradients of the
    optimizer's parameters down to a total 2-norm of at most ``max_norm``; returns the
    norm before clipping (inf/NaN when a gradient is: the scaler then skips the step)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    grads = [p for p in optimizer_params(optimizer) if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(grads, max_norm)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    clip: float | None = None,
) -> bool:
    """(unscale and clip) → step → scaler update → zero_grad on the gradients the
    parameters hold; returns whether the optimizer stepped (not when no gradient reached
    it: ``GradScaler.step`` refuses an optimizer without recorded inf checks)."""
    has_grads = any(p.grad is not None for p in optimizer_params(optimizer))
    if has_grads:
        if clip is not None:
            clip_gradients(optimizer, scaler, clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return has_grads


def scaled_step(
    loss: torch.Tensor | None,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
) -> bool:
    """(scaled) backward → :func:`optimizer_step`; ``loss`` None: nothing to
    backpropagate."""
    if loss is not None:
        (scaler.scale(loss) if scaler is not None else loss).backward()
    return optimizer_step(optimizer, scaler)


class Accumulation:
    """One optimizer step per ``every`` micro-batches (a window): each loss is
    backpropagated divided by ``every``; the window's last micro-batch (or one marked
    ``last``) steps, clipping at ``clip``. ``pending``: micro-batches in the open window."""

    def __init__(self, every: int = 1, clip: float | None = None) -> None:
        self.every = check_accumulate(every)
        self.clip = check_clip(clip)
        self.pending = 0

    def add(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        last: bool = False,
    ) -> bool:
        """Backpropagate ``loss`` / ``every``; step when the window is full or ``last``.
        Returns whether the optimizer stepped (False while the window is open)."""
        share = loss / self.every if self.every > 1 else loss
        (scaler.scale(share) if scaler is not None else share).backward()
        self.pending += 1
        if self.pending < self.every and not last:
            return False
        return self.close(optimizer, scaler)

    def close(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> bool:
        """Step on what the window holds (a partial window at an epoch's end)."""
        self.pending = 0
        return optimizer_step(optimizer, scaler, self.clip)


@contextmanager
def cell_autocast(controller: AmpController, mode: str | None, device_type: str) -> Iterator[None]:
    """Autocast for one block (a notebook cell) without changing the session's policy;
    ``auto`` on a CPU that would emulate bf16 runs the block in fp32."""
    mode = mode or "auto"
    dtype = choose_dtype(device_type, mode)
    if keeps_fp32(device_type, mode):
        yield
        return
    with controller.autocast(dtype=dtype, device_type=device_type):
        yield
