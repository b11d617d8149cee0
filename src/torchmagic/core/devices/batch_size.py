"""The largest batch whose training step fits: measure a few small steps, fit one
line per phase (forward, backward, optimizer step: activation memory grows linearly with
the batch), take the batch where the first phase runs out of room, confirm at the answer.

The phases are fitted apart because at small batches the optimizer step (gradients plus a
foreach optimizer's temporaries, the same at every batch) can be the step's peak: a line
through the peaks alone would then be flat and say that nothing grows with the batch.

A binary search of real out-of-memory errors (as Lightning's ``Tuner.scale_batch_size``
does) needs a step per halving, several of them failing at the device's limit; here the
probes are small and one step confirms. On CUDA the steps are real: everything a step
changes (weights, gradients, optimizer state, BatchNorm statistics, the RNG) is
snapshotted to the host before and restored after; the user's GradScaler is never used
(fp16 probes get their own). On the CPU every step is the meta-device replica of
``estimate.step_peak``, checked against a budget: no real step runs, nothing changes.

Given the ``effective_batch`` wanted per optimizer step, the report also says how to
reach it by gradient accumulation: the fewest micro-batches that fit (``accumulate`` =
⌈effective / largest⌉), each of ⌈effective / accumulate⌉ samples — the smallest size
that reaches the target with that many, so a step holds at least ``effective_batch``
samples and fewer than ``accumulate`` more.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ..errors import TorchMagicError
from ..integrations.lookup import state_of
from ..modules import unwrap
from ..tensors import state_tensors, total_bytes
from ..training.amp import scaled_step
from . import hostmem
from .estimate import step_peak
from .placement import reference_device

PROBES = (2, 4, 8)  # batch sizes measured first (2: BatchNorm1d needs more than one sample)
MARGIN = 0.05  # capacity kept free on CUDA for the allocator's fragmentation


PHASES = ("forward", "backward", "optimizer step")


@dataclass(frozen=True)
class BatchPoint:
    batch: int
    step_bytes: int  # the step's peak above what was allocated before it
    phases: tuple[int, ...] = ()  # each phase's own peak, in the order of PHASES


@dataclass(frozen=True)
class BatchSizeReport:
    """The answer, the line it came from and how it was found."""

    device: str
    batch: int  # the largest batch that fits (0: not even the smallest probe)
    capacity: int  # bytes the step may use above the persistent tensors
    fixed_bytes: int  # the limiting phase's line: fixed_bytes + per_sample_bytes × batch
    per_sample_bytes: int
    phase: str  # the phase whose line limits the batch (one of PHASES; "" without a line)
    points: tuple[BatchPoint, ...]
    confirmed_bytes: int | None  # the step at the answer (CUDA: real; CPU: meta replica)
    backoffs: int  # out-of-memory errors (CUDA) or failed checks while confirming
    capped: bool  # the answer is max_batch, not the memory limit
    seconds: float
    effective_batch: int | None = None  # samples wanted per optimizer step

    @property
    def accumulation(self) -> tuple[int, int] | None:
        """(accumulate, micro-batch size) reaching ``effective_batch`` with batches that
        fit; None without a target or when no batch fits."""
        if self.effective_batch is None or not self.batch:
            return None
        return accumulation_for(self.effective_batch, self.batch)


def accumulation_for(effective: int, largest: int) -> tuple[int, int]:
    """(accumulate, micro-batch size): the fewest micro-batches of at most ``largest``
    samples adding up to at least ``effective``, each as small as that allows."""
    accumulate = math.ceil(effective / largest)
    return accumulate, math.ceil(effective / accumulate)


def check_effective_batch(effective_batch: object) -> int | None:
    if effective_batch is None:
        return None
    if (
        isinstance(effective_batch, bool)
        or not isinstance(effective_batch, int)
        or effective_batch < 1
    ):
        raise TorchMagicError(
            f"effective_batch must be a whole number of samples ≥ 1, got {effective_batch!r}",
            param="effective_batch",
        )
    return effective_batch


class _Snapshot:
    """Host copies of everything a training step changes, restored in place."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model, self.optimizer = model, optimizer
        self.tensors = [(t, _host(t)) for t in (*model.parameters(), *model.buffers())]
        self.grads: list[tuple[torch.Tensor, torch.Tensor | None]] = [
            (p, None if p.grad is None else _host(p.grad)) for p in model.parameters()
        ]
        self.state: dict[torch.Tensor, dict] = {}
        # the groups' settings: a step may count in them (timm's Lookahead's lookahead_step)
        self.groups = [] if optimizer is None else [dict(g) for g in optimizer.param_groups]
        if optimizer is not None:
            for p, entry in state_of(optimizer).items():
                self.state[p] = {k: _host(v) if torch.is_tensor(v) else v for k, v in entry.items()}
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def drop_grads(self) -> None:
        """Free the gradients while probing (the host copies keep their values)."""
        for p, _ in self.grads:
            p.grad = None

    def restore(self) -> None:
        with torch.no_grad():
            for t, saved in self.tensors:
                t.copy_(saved)
            for p, grad in self.grads:
                p.grad = None if grad is None else grad.to(p.device)
        if self.optimizer is not None:
            state = state_of(self.optimizer)
            for p in [p for p in state if p not in self.state]:
                del state[p]
            for p, saved_entry in self.state.items():
                live = state[p]
                for key in [k for k in live if k not in saved_entry]:
                    del live[key]
                for key, value in saved_entry.items():
                    if torch.is_tensor(value) and torch.is_tensor(live.get(key)):
                        with torch.no_grad():
                            live[key].copy_(value)
                    else:
                        live[key] = value.clone() if torch.is_tensor(value) else value
            for group, settings in zip(self.optimizer.param_groups, self.groups, strict=True):
                group.update(settings)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    x: torch.Tensor,
    amp_dtype: torch.dtype | None,
    phase: Callable[[str], None],
) -> None:
    """forward → sum of the outputs as the loss → backward → step → zero_grad, calling
    ``phase`` with each phase's name (of PHASES) as it begins."""
    scaler = torch.amp.GradScaler(x.device.type) if amp_dtype is torch.float16 else None
    phase(PHASES[0])
    with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        out = model(x)
        floats = [t for t in tree_flatten(out)[0] if torch.is_tensor(t) and t.requires_grad]
        loss = torch.stack([t.float().sum() for t in floats]).sum() if floats else None
    del out, floats
    phase(PHASES[1])
    if loss is not None:
        (scaler.scale(loss) if scaler is not None else loss).backward()
    del loss
    phase(PHASES[2])
    if optimizer is not None:
        scaled_step(None, optimizer, scaler)
    model.zero_grad(set_to_none=True)


def _fit_line(batches: Sequence[int], used: Sequence[int]) -> tuple[float, float]:
    """(fixed, per sample) by least squares over the points."""
    n = len(batches)
    mean_b = sum(batches) / n
    mean_m = sum(used) / n
    spread = sum((b - mean_b) ** 2 for b in batches)
    slope = sum((b - mean_b) * (m - mean_m) for b, m in zip(batches, used, strict=True)) / spread
    return mean_m - slope * mean_b, slope


def _limit(points: Sequence[BatchPoint], capacity: int) -> tuple[float, str, float, float]:
    """(largest batch that fits, limiting phase, its fixed bytes, its bytes per sample),
    each phase on its own line; the batch is ``math.inf`` when no phase grows."""
    batches = [p.batch for p in points]
    lines = []
    for i, name in enumerate(PHASES):
        used = [p.phases[i] for p in points]
        fixed, slope = _fit_line(batches, used)
        if slope > 0:
            fits: float = max(math.floor((capacity - fixed) / slope), 0)
        else:  # flat: it fits at every batch or at none
            fits = math.inf if max(used) <= capacity else 0
        lines.append((fits, -slope, name, fixed, max(slope, 0.0)))
    fits, _, name, fixed, slope = min(lines)  # the first to run out; a tie: the steepest
    return fits, name, fixed, slope


def find_batch_size(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    input_shape: Sequence[int],
    *,
    budget: int | None = None,
    max_batch: int | None = None,
    amp_dtype: torch.dtype | None = None,
) -> BatchSizeReport:
    """The largest batch of inputs of ``input_shape`` (one sample, without the batch
    dimension) whose training step fits where the model lives.

    CUDA: the free memory of the model's GPU (plus what torch's cache holds unused), less
    a 5 % margin; real steps. CPU: ``budget`` bytes for the whole training setup (default:
    the RAM available now plus what the model and optimizer already hold). ``amp_dtype``:
    steps under autocast (fp16 with a private GradScaler). Leaves weights, gradients,
    optimizer state, buffers and the RNG as they were.
    """
    real = unwrap(model)
    sample = tuple(int(n) for n in input_shape)
    if not sample or any(n < 1 for n in sample):
        raise TorchMagicError(
            f"input shape must be positive sizes (one sample, no batch dimension), got "
            f"{tuple(input_shape)}",
            param="input_shape",
        )
    if max_batch is not None and max_batch < 1:
        raise TorchMagicError(f"max_batch must be at least 1, got {max_batch}", param="max_batch")
    device = reference_device(real) or torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise TorchMagicError(f"batch size search runs on cpu or cuda, not {device}")
    if budget is not None and device.type == "cuda":
        raise TorchMagicError(
            "a budget applies to the CPU; a GPU's limit is its memory", param="budget"
        )
    started = time.perf_counter()
    persistent = total_bytes((*real.parameters(), *real.buffers()))
    if optimizer is not None:
        persistent += total_bytes(state_tensors(optimizer))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        grads = total_bytes(p.grad for p in real.parameters() if p.grad is not None)
        capacity = int((free + cached + grads) * (1 - MARGIN))  # grads are freed to probe
    else:
        if budget is None:
            available, _ = hostmem.machine_memory()
            if available is None:
                raise TorchMagicError(
                    "available RAM is unknown here: give a budget", param="budget"
                )
            budget = available + persistent
        capacity = budget - persistent
    dtype = next((p.dtype for p in real.parameters() if p.is_floating_point()), None)
    dtype = dtype or torch.get_default_dtype()

    def measure(batch: int) -> BatchPoint | None:
        """Bytes a step at ``batch`` needs above what is allocated, per phase; None on out
        of memory. CUDA: a real step, the allocator's peak since each phase began. CPU: the
        meta-device replica of ``step_peak`` (a real CPU step at a large
        batch takes minutes; the replica runs the same autograd formulas, no compute)."""
        if device.type == "cpu":
            peak = step_peak(real, optimizer, (batch, *sample), amp_dtype=amp_dtype).phases
            phases = tuple(max(peak[name] - persistent, 0) for name in PHASES)
            return BatchPoint(batch, max(phases), phases)
        x = torch.randn((batch, *sample), device=device, dtype=dtype)
        peaks: dict[str, int] = {}
        began: list[str] = []

        def phase(name: str) -> None:
            torch.cuda.synchronize(device)
            if began:
                peaks[began[-1]] = torch.cuda.max_memory_allocated(device) - before
            torch.cuda.reset_peak_memory_stats(device)
            began.append(name)

        try:
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            _train_step(real, optimizer, x, amp_dtype, phase)
            phase("")
        except torch.OutOfMemoryError:
            return None
        finally:
            del x
        phases = tuple(max(peaks.get(name, 0), 0) for name in PHASES)
        return BatchPoint(batch, max(phases), phases)

    snapshot = _Snapshot(real, optimizer) if device.type == "cuda" else None  # real steps
    if snapshot is not None:
        snapshot.drop_grads()
    points: list[BatchPoint] = []
    try:
        with torch.enable_grad():
            # a first real step creates the optimizer state (the replica predicts it)
            if device.type == "cpu" or measure(PROBES[0]) is not None:
                for batch in PROBES:
                    point = measure(batch)
                    if point is None:
                        break
                    points.append(point)
            fits, phase, fixed, per_sample = 0.0, "", 0.0, 0.0
            if len(points) >= 2:
                fits, phase, fixed, per_sample = _limit(points, capacity)
            answer, confirmed, backoffs = 0, None, 0
            if len(points) >= 2 and fits < math.inf:
                answer = int(fits)
                if max_batch is not None:
                    answer = min(answer, max_batch)
                near = points[-1]  # the largest step known to fit
                while answer > 0:
                    at = measure(answer)
                    confirmed = None if at is None else at.step_bytes
                    if confirmed is not None and confirmed <= capacity:
                        break
                    backoffs += 1
                    if at is None or near.step_bytes > capacity:  # out of memory: back off
                        answer = math.floor(answer * 0.9)
                        continue
                    # the peak bends upward (another tensor becomes the largest): the chord
                    # through a step that fits and one that does not is a safe line
                    fits, phase, fixed, per_sample = _limit([near, at], capacity)
                    answer = int(min(fits, answer - 1))
            elif len(points) >= 2:  # memory does not grow with the batch: no limit from it
                answer, phase = max_batch or 0, ""
    finally:
        if snapshot is not None:
            snapshot.restore()
    return BatchSizeReport(
        device=str(device),
        batch=answer,
        capacity=capacity,
        fixed_bytes=round(fixed),
        per_sample_bytes=round(per_sample),
        phase=phase,
        points=tuple(points),
        confirmed_bytes=confirmed if answer else None,
        backoffs=backoffs,
        capped=max_batch is not None and answer == max_batch,
        seconds=time.perf_counter() - started,
    )
