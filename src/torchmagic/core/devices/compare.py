"""Is the GPU worth it for *this* model and batch? Time real training steps everywhere.

CUDA being available does not mean every batch should go there: a small model, or a
batch whose host→device copy costs more than the maths, can train faster on the CPU.
:func:`compare` times a few optimizer steps on one real batch on the CPU and on every
accelerator present, the host→device copy included, and says which is faster and by how
much.

Nothing live is trained: each device gets a deep copy of the model and a fresh optimizer
of the same class, hyper-parameters and (copied) state; every random generator is
restored afterwards, so the user's next epoch is the one it would have been.
"""

from __future__ import annotations

import copy
import inspect
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import TorchMagicError
from ..integrations.lookup import state_holder
from ..modules import unwrap
from ..rng import preserved_rng
from ..tensors import leaves, nbytes, state_bytes, total_bytes
from ..training.data import call_model, split_batch, to_device
from . import hostmem
from .device import _mps_available, cuda_note, resolve_device

DEFAULT_STEPS = 5
DEFAULT_WARMUP = 2  # the first steps pay for allocator growth, cuDNN autotuning, lazy init


@dataclass(frozen=True)
class DeviceTiming:
    """Medians over the timed steps on one device; ``skipped`` says why it was not timed."""

    device: str
    step_ms: float = 0.0  # one optimizer step, host→device copy of the batch included
    copy_ms: float = 0.0  # the host→device copy alone
    samples_per_s: float = 0.0
    skipped: str = ""

    @property
    def timed(self) -> bool:
        return not self.skipped


@dataclass(frozen=True)
class CompareReport:
    model_name: str
    batch_size: int
    batch_bytes: int
    steps: int  # timed steps per device, after the warm-up steps
    warmup: int
    optimizer: str  # the class rebuilt for the copies ("SGD (no optimizer bound)" …)
    timings: tuple[DeviceTiming, ...]  # the CPU first
    accelerators: tuple[str, ...]  # what this machine has besides the CPU
    no_accelerator: str  # why there is none ("" when there is one)

    @property
    def ranked(self) -> tuple[DeviceTiming, ...]:
        """Timed devices, fastest first."""
        return tuple(sorted((t for t in self.timings if t.timed), key=lambda t: t.step_ms))

    @property
    def fastest(self) -> str:
        ranked = self.ranked
        return ranked[0].device if ranked else ""

    @property
    def runner_up(self) -> str:
        ranked = self.ranked
        return ranked[1].device if len(ranked) > 1 else ""

    @property
    def speedup(self) -> float:
        """How many times faster the fastest device is than the next one (1.0 alone)."""
        ranked = self.ranked
        if len(ranked) < 2 or not ranked[0].step_ms:
            return 1.0
        return ranked[1].step_ms / ranked[0].step_ms

    @property
    def cpu_only(self) -> bool:
        return not self.accelerators


def accelerators() -> list[torch.device]:
    """Every CUDA device and the MPS device this machine has (none initialises CUDA)."""
    found = []
    if torch.cuda.is_available():
        found += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if _mps_available():
        found.append(torch.device("mps", 0))
    return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def first_batch(source: object) -> Any:
    """One real batch: ``source`` itself when it is a batch, the first of a list of
    batches, else the first item of a fresh iteration. A one-shot iterator is refused:
    taking from it would lose the user's batch."""
    if isinstance(source, (list, tuple)) and source and isinstance(source[0], (list, tuple, dict)):
        return source[0]  # a list of batches, as %fit takes
    if isinstance(source, (torch.Tensor, list, tuple, dict)):
        return source
    if not isinstance(source, Iterable):
        raise TorchMagicError(
            f"expected a DataLoader, an iterable of batches or a batch, got "
            f"{type(source).__name__}",
            param="source",
        )
    if isinstance(source, Iterator):
        raise TorchMagicError(
            f"{type(source).__name__} is a one-shot iterator: taking a batch from it would "
            "consume it; pass the DataLoader (or a batch) instead",
            param="source",
        )
    iterator = iter(source)
    try:
        return next(iterator)
    except StopIteration:
        raise TorchMagicError("the loader yields no batch", param="source") from None
    finally:
        del iterator  # shuts a multi-process loader's workers down


def _constructor_kwargs(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults its class accepts again as keyword arguments (AdamW keeps
    ``decoupled_weight_decay`` in its defaults but takes no such argument)."""
    signature = inspect.signature(type(optimizer).__init__)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in signature.parameters}


def replicate(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A deep copy of ``model`` on ``device`` and a fresh optimizer over it: same class,
    same param groups (hyper-parameters included), a copy of the state. Never a deep copy
    of the optimizer itself: an LR scheduler's wrapper around ``step`` would still step the
    live one. An optimizer stepping a base one (timm's ``Lookahead``) is copied as its
    base, which holds the groups and the state: the slow update every k steps is not timed."""
    memo: dict[int, Any] = {}
    replica = copy.deepcopy(model, memo).to(device)
    if optimizer is None:
        return replica, torch.optim.SGD(p for p in replica.parameters() if p.requires_grad)
    optimizer = state_holder(optimizer)
    groups = []
    for group in optimizer.param_groups:
        params = [copy.deepcopy(p, memo) for p in group["params"]]
        for p in params:  # parameters the optimizer holds outside the model
            if p.device != device:
                p.data = p.data.to(device)
        hyper = copy.deepcopy({k: v for k, v in group.items() if k != "params"})
        groups.append({**hyper, "params": params})
    try:
        fresh = type(optimizer)(groups, **_constructor_kwargs(optimizer))
    except TypeError as error:
        raise TorchMagicError(
            f"cannot build a second {type(optimizer).__name__} to time copies with ({error}); "
            "the live optimizer is never stepped for a measurement",
            param="optimizer",
        ) from None
    fresh.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    return replica, fresh


def _needed_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """A copy's weights, its gradients and its optimizer state (activations come on top)."""
    weights = total_bytes([*model.parameters(), *model.buffers()])
    grads = sum(nbytes(p) for p in model.parameters() if p.requires_grad)
    state = state_bytes(optimizer) if optimizer is not None else 0
    return weights + grads + state


def _room(device: torch.device) -> int | None:
    """Free bytes on ``device`` (None: unknown)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        return hostmem.machine_memory()[0]
    return None


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _time_on(
    device: torch.device,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    inputs: Any,
    targets: Any,
    loss_fn: Callable,
    *,
    steps: int,
    warmup: int,
) -> DeviceTiming:
    needed, room = _needed_bytes(model, optimizer), _room(device)
    if room is not None and needed > room:
        return DeviceTiming(
            str(device),
            skipped=f"a copy needs {needed / 2**20:.0f} MiB, {room / 2**20:.0f} MiB are free",
        )
    pinned = all(t.is_pinned() for t in leaves(inputs)) if device.type == "cuda" else False
    replica, fresh = replicate(model, optimizer, device)
    replica.train()
    copies, totals = [], []
    try:
        for i in range(warmup + steps):
            start = time.perf_counter()
            x = to_device(inputs, device, pinned)
            y = to_device(targets, device, pinned)
            _sync(device)
            copied = time.perf_counter()
            output = call_model(replica, x)
            output = getattr(output, "logits", output)  # Inception-style namedtuples
            loss_fn(output, y).backward()
            fresh.step()
            fresh.zero_grad(set_to_none=True)
            _sync(device)
            if i >= warmup:
                copies.append((copied - start) * 1e3)
                totals.append((time.perf_counter() - start) * 1e3)
    except torch.OutOfMemoryError:
        return DeviceTiming(str(device), skipped="ran out of memory during the step")
    except (IndexError, RuntimeError, ValueError) as error:  # the batch does not fit the model
        raise TorchMagicError(
            f"a training step on one batch fails on {device}: {str(error).splitlines()[0]} "
            "(labels beyond the head's outputs? doctor() checks labels against the head)",
            param="loader",
        ) from None
    finally:
        del replica, fresh
        if device.type == "cuda":
            torch.cuda.empty_cache()
    step_ms = _median(totals)
    batch = len(targets) if hasattr(targets, "__len__") else 1
    return DeviceTiming(
        str(device),
        step_ms=step_ms,
        copy_ms=_median(copies),
        samples_per_s=batch / step_ms * 1e3 if step_ms else 0.0,
    )


def compare(
    model: nn.Module,
    source: object,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    loss_fn: Callable = F.cross_entropy,
    devices: Iterable[str | torch.device] | None = None,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    model_name: str = "model",
) -> CompareReport:
    """Time ``steps`` training steps of copies of ``model`` (with ``optimizer``'s class,
    groups and state) on one batch of ``source`` on each of ``devices`` (default: the CPU
    and every accelerator present). fp32, whatever the session's AMP policy."""
    if steps < 1:
        raise TorchMagicError(f"steps must be at least 1, got {steps}", param="steps")
    if warmup < 0:
        raise TorchMagicError(f"warmup must be 0 or more, got {warmup}", param="warmup")
    real = unwrap(model)
    present = accelerators()
    targets_list = (
        [torch.device("cpu"), *present]
        if devices is None
        else list(dict.fromkeys(resolve_device(d) if isinstance(d, str) else d for d in devices))
    )
    if any(d.type == "cuda" for d in targets_list):
        torch.cuda.init()  # before the RNG snapshot, so the GPUs' generators are restored too
    with preserved_rng([getattr(source, "generator", None)]):
        batch = first_batch(source)
        try:
            inputs, targets = split_batch(batch)
        except TypeError as error:
            raise TorchMagicError(str(error), param="source") from None
        timings = tuple(
            _time_on(d, real, optimizer, inputs, targets, loss_fn, steps=steps, warmup=warmup)
            for d in targets_list
        )
    base = state_holder(optimizer)
    if optimizer is None:
        optimizer_name = "SGD (no optimizer holds the model)"
    elif base is not optimizer:
        optimizer_name = f"{type(base).__name__} (the {type(optimizer).__name__}'s base)"
    else:
        optimizer_name = type(optimizer).__name__
    reasons = [f"no CUDA device ({cuda_note()})"] if not torch.cuda.is_available() else []
    return CompareReport(
        model_name=model_name,
        batch_size=len(targets) if hasattr(targets, "__len__") else 1,
        batch_bytes=total_bytes(leaves((inputs, targets))),
        steps=steps,
        warmup=warmup,
        optimizer=optimizer_name,
        timings=timings,
        accelerators=tuple(str(d) for d in present),
        no_accelerator="" if present else "; ".join(reasons + ["no MPS device"]),
    )
