"""Devices: what this machine has, which one the session uses, and moving a whole
training setup (model, optimizer state, GradScaler) there in one step.

Nothing here initialises CUDA unless ``torch.cuda.is_available()`` says there is a GPU
(``is_available`` and ``device_count`` themselves do not initialise it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import TorchMagicError
from ..integrations.lookup import state_of
from ..modules import unwrap
from ..tensors import nbytes, state_entries
from . import hostmem
from .placement import Misplaced, find_misplaced

_CHOICES = "auto, cpu, cuda, cuda:N or mps"


@dataclass(frozen=True)
class DeviceInfo:
    """One device as :func:`list_devices` reports it."""

    name: str  # "cpu", "cuda:0", "mps:0"
    description: str  # processor or GPU model
    capability: str  # CUDA compute capability "9.0"; "" elsewhere
    free_bytes: int | None
    total_bytes: int | None
    bf16: bool | None  # native bfloat16 (CUDA: capability ≥ 8.0); None: unknown
    detail: str  # threads, multiprocessors, …
    current: bool  # the session's device


@dataclass(frozen=True)
class DeviceReport:
    devices: tuple[DeviceInfo, ...]
    current: str
    notes: tuple[str, ...]  # why CUDA / MPS are missing, when they are


@dataclass(frozen=True)
class MoveReport:
    """What ``move`` carried to ``device``, in bytes, and what ``.to()`` cannot carry."""

    model_name: str
    device: str
    model_bytes: int  # parameters and buffers
    grad_bytes: int
    optimizer_bytes: int
    scaler_bytes: int
    tensors: int
    left_behind: tuple[Misplaced, ...]  # e.g. unregistered tensor attributes

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.grad_bytes + self.optimizer_bytes + self.scaler_bytes


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _cuda_index(index: int | None) -> int:
    """The device an index-less "cuda" means, without initialising CUDA to ask."""
    if index is not None:
        return index
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` → ``cuda:N`` (tensors always report an index, so compare against one)."""
    if device.index is None and device.type in ("cuda", "mps"):
        return torch.device(device.type, _cuda_index(None) if device.type == "cuda" else 0)
    return device


def resolve_device(spec: str | torch.device) -> torch.device:
    """``auto`` (cuda, else mps, else cpu), ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` as a
    concrete device; one that this machine lacks is refused with the reason."""
    text = str(spec).strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", _cuda_index(None))
        if _mps_available():
            return torch.device("mps", 0)
        return torch.device("cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise TorchMagicError(f"unknown device '{spec}': use {_CHOICES}", param="device") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TorchMagicError(
                f"{text}: CUDA is not available here ({cuda_note()})", param="device"
            )
        count = torch.cuda.device_count()
        index = _cuda_index(device.index)
        if index >= count:
            raise TorchMagicError(
                f"{text}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}",
                param="device",
            )
        return torch.device("cuda", index)
    if device.type == "mps":
        if not _mps_available():
            raise TorchMagicError(f"{text}: MPS (Apple GPU) is not available here", param="device")
        return torch.device("mps", 0)
    raise TorchMagicError(
        f"{text}: not a device torchmagic manages; use {_CHOICES}", param="device"
    )


def cuda_note() -> str:
    """Why there is no CUDA device, in words."""
    if torch.version.cuda is None:
        return "this torch is a CPU-only build"
    return f"torch is built for CUDA {torch.version.cuda} but sees no GPU or driver"


def _cpu_info(current: bool) -> DeviceInfo:
    available, total = hostmem.machine_memory()
    return DeviceInfo(
        name="cpu",
        description=hostmem.cpu_name(),
        capability="",
        free_bytes=available,
        total_bytes=total,
        bf16=True,  # autocast("cpu", bfloat16) works everywhere; fast with AVX512-BF16/AMX
        detail=f"{torch.get_num_threads()} torch threads",
        current=current,
    )


def _cuda_info(index: int, current: bool) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    return DeviceInfo(
        name=f"cuda:{index}",
        description=props.name,
        capability=f"{props.major}.{props.minor}",
        free_bytes=free,
        total_bytes=total,
        bf16=props.major >= 8,
        detail=f"{props.multi_processor_count} SMs",
        current=current,
    )


def _mps_info(current: bool) -> DeviceInfo:
    recommended = getattr(torch.mps, "recommended_max_memory", None)
    total = recommended() if recommended is not None else None
    used = torch.mps.current_allocated_memory()
    return DeviceInfo(
        name="mps:0",
        description="Apple GPU (Metal)",
        capability="",
        free_bytes=None if total is None else max(total - used, 0),
        total_bytes=total,
        bf16=None,
        detail=f"{used} bytes allocated by torch",
        current=current,
    )


def list_devices(current: str | torch.device | None = None) -> DeviceReport:
    """Every device torch can use here; ``current`` (default: ``auto``) is marked.

    On a GPU machine this initialises CUDA (names and free memory need it).
    """
    now = resolve_device(current if current is not None else "auto")
    devices = [_cpu_info(now.type == "cpu")]
    notes: list[str] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            devices.append(_cuda_info(i, now == torch.device("cuda", i)))
    else:
        notes.append(f"no CUDA device: {cuda_note()}")
    if _mps_available():
        devices.append(_mps_info(now.type == "mps"))
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_built():
        notes.append("MPS is built into this torch but not available (macOS 12.3+ needed)")
    return DeviceReport(tuple(devices), str(now), tuple(notes))


def _model_bytes_to_move(model: nn.Module, device: torch.device) -> tuple[int, int, int]:
    """(parameter + buffer bytes, gradient bytes, tensor count) not yet on ``device``."""
    weights = grads = tensors = 0
    for t in (*model.parameters(), *model.buffers()):
        if t.device != device:
            if t.is_meta:
                raise TorchMagicError(
                    "the model has tensors on the meta device (shapes without data): "
                    f"use model.to_empty(device='{device}') and load a state_dict instead"
                )
            weights += nbytes(t)
            tensors += 1
        grad = t.grad
        if grad is not None and grad.device != device:
            grads += nbytes(grad)
            tensors += 1
    return weights, grads, tensors


def _state_bytes_to_move(optimizer: torch.optim.Optimizer | None, device: torch.device) -> int:
    if optimizer is None:
        return 0
    return sum(
        nbytes(e.value)
        for e in state_entries(optimizer)
        if e.follows_param and e.value.device != device
    )


def _check_room(device: torch.device, needed: int) -> None:
    """Refuse before moving anything when the GPU clearly cannot take it (a move that
    runs out of memory half-way would leave the model split across devices)."""
    if device.type != "cuda" or not needed:
        return
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if needed > free + cached:
        raise TorchMagicError(
            f"{device} has {(free + cached) / 2**20:.0f} MiB free, the move needs "
            f"{needed / 2**20:.0f} MiB; free memory on it first (the memory breakdown "
            "shows where it went)"
        )


@contextlib.contextmanager
def _identity_preserving(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Make ``model.to`` keep every Parameter object (optimizer references stay valid).

    torch keeps them by default (``param.data = …``) but creates new Parameters when the
    target's tensor type differs (meta, XLA) or when the user opted into
    ``overwrite_module_params_on_conversion``; swapping tensors keeps them in those cases.
    """
    future = torch.__future__
    swap = future.get_swap_module_params_on_conversion()
    probe = torch.empty(0, device=device)
    needed = future.get_overwrite_module_params_on_conversion() or any(
        not torch._has_compatible_shallow_copy_type(p, probe)
        for p in model.parameters()
        if p.device != device
    )
    future.set_swap_module_params_on_conversion(swap or needed)
    try:
        yield
    finally:
        future.set_swap_module_params_on_conversion(swap)


def _move_optimizer(optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """Each state tensor to its parameter's device, replaced in the same dict entry."""
    misplaced = [e for e in state_entries(optimizer) if e.misplaced]
    for e in misplaced:
        state_of(optimizer)[e.param][e.key] = e.value.to(e.param.device)
    return sum(nbytes(e.value) for e in misplaced), len(misplaced)


def _move_scaler(scaler: torch.amp.GradScaler, device: torch.device) -> tuple[int, int]:
    if not scaler.is_enabled():
        return 0, 0
    moved = tensors = 0
    for attr in ("_scale", "_growth_tracker"):
        value = getattr(scaler, attr)
        if value is not None and value.device != device:
            setattr(scaler, attr, value.to(device))
            moved += nbytes(value)
            tensors += 1
    scaler._device = device.type
    return moved, tensors


def move(
    model: nn.Module,
    device: str | torch.device,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
    *,
    model_name: str = "model",
) -> MoveReport:
    """Move the model, its optimizer state and GradScaler to ``device`` in place.

    Parameter objects stay the same (the optimizer, schedulers and any user reference keep
    working); state tensors follow their parameter (``step`` stays on the host unless the
    group is capturable or fused, as torch keeps it). Tensors ``.to()`` cannot reach are
    reported in ``left_behind``.
    """
    target = resolve_device(device) if isinstance(device, str) else _indexed(device)
    real = unwrap(model)
    weights, grads, tensors = _model_bytes_to_move(real, target)
    _check_room(target, weights + grads + _state_bytes_to_move(optimizer, target))
    with _identity_preserving(real, target):
        real.to(target)
    opt_bytes = opt_tensors = scaler_bytes = scaler_tensors = 0
    if optimizer is not None:
        opt_bytes, opt_tensors = _move_optimizer(optimizer)
    if scaler is not None:
        scaler_bytes, scaler_tensors = _move_scaler(scaler, target)
    left = find_misplaced(real, optimizer, scaler, model_name=model_name).misplaced
    return MoveReport(
        model_name=model_name,
        device=str(target),
        model_bytes=weights,
        grad_bytes=grads,
        optimizer_bytes=opt_bytes,
        scaler_bytes=scaler_bytes,
        tensors=tensors + opt_tensors + scaler_tensors,
        left_behind=left,
    )
