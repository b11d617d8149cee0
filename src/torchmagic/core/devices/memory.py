"""Where memory goes: the bytes of parameters (trainable / frozen), gradients and optimizer
state, against what the device says is in use; peaks, per-cell deltas and tracebacks.

On CUDA the totals come from torch's caching allocator; on the CPU from the process's
resident set (``/proc``), which also holds the interpreter and libraries. Tensor bytes are
counted by walking the model and optimizer, each tensor once (tied weights once). CUDA is
queried only once something has initialised it, so nothing here initialises it.
"""

from __future__ import annotations

import gc
import itertools
import sys
import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType

import torch
from torch import nn

from ..modules import unwrap
from ..tensors import leaves, nbytes, optimizer_params, state_tensors, total_bytes, unique
from . import hostmem
from .estimate import full_finetune_state
from .placement import reference_device

# Lists / dicts in the user namespace longer than this are not searched for tensors that
# the last traceback shares with them (a dataset held in a list costs too much to walk).
NAMESPACE_SCAN_ITEMS = 10_000


@dataclass(frozen=True)
class MemoryReport:
    """Tensor bytes on ``device`` by role, and the device's own totals.

    ``in_use``/``peak``: CUDA ``memory_allocated``/``max_memory_allocated``, or the
    process's resident set and its peak on the CPU (``source`` says which); ``None`` where
    the platform cannot tell.
    """

    model_name: str | None
    device: str
    source: str  # "cuda allocator", "process RSS" or "" (no totals: meta)
    params_trainable: int
    params_frozen: int
    buffers: int
    grads: int
    optimizer_state: int
    elsewhere: int  # bytes of the same model/optimizer on other devices
    in_use: int | None
    reserved: int | None  # CUDA only: held by the caching allocator
    peak: int | None
    free: int | None
    total: int | None
    traceback_frames: int
    traceback_bytes: int  # tensors referenced by those frames' locals
    history_bytes: int = 0  # host tensors the undo history keeps alive (set aside for undo)
    # with LoRA adapters: the optimizer state full fine-tuning would hold (estimated)
    full_finetune_state: int | None = None

    @property
    def tensors(self) -> int:
        return (
            self.params_trainable
            + self.params_frozen
            + self.buffers
            + self.grads
            + self.optimizer_state
        )

    @property
    def rest(self) -> int | None:
        """What the device holds beyond the counted tensors: activations, the cache and
        other tensors on CUDA; also interpreter and libraries on the CPU."""
        return None if self.in_use is None else max(self.in_use - self.tensors, 0)


@dataclass(frozen=True)
class ResetReport:
    peaks: tuple[str, ...]  # devices whose peak counter was reset
    frames_dropped: int
    released_bytes: int  # tensors those frames referenced (freed unless held elsewhere)


@dataclass(frozen=True)
class CellMemory:
    """One cell's memory: ``in_use`` before and after, and the peak during it."""

    device: str
    before: int
    after: int
    peak: int | None

    @property
    def delta(self) -> int:
        return self.after - self.before


def _cuda_used() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _report_device(model: nn.Module | None) -> torch.device:
    ref = reference_device(model) if model is not None else None
    if ref is not None:
        return ref
    if _cuda_used():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _frames(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _last_traceback() -> TracebackType | None:
    return getattr(sys, "last_traceback", None)


def _reachable_from(namespaces: Iterable[Mapping]) -> set[int]:
    """``id`` of the tensors a namespace reaches: bound to a name, inside a list, tuple or
    dict bound to one, and the parameters, buffers and gradients of a bound module."""
    found: set[int] = set()
    for namespace in namespaces:
        for value in list(namespace.values()):
            for leaf in leaves(
                value, depth=2, kind=(torch.Tensor, nn.Module), max_items=NAMESPACE_SCAN_ITEMS
            ):
                if isinstance(leaf, nn.Module):
                    for t in itertools.chain(leaf.parameters(), leaf.buffers()):
                        found.add(id(t))
                        if t.grad is not None:
                            found.add(id(t.grad))
                else:
                    found.add(id(leaf))
    return found


def traceback_hold(namespace: Mapping | None = None) -> tuple[int, int]:
    """(frames, tensor bytes) the last uncaught exception's traceback alone keeps alive.

    IPython stores it in ``sys.last_traceback``; the locals of its frames (a batch, the
    activations of a failed forward) stay referenced until the next error replaces it.
    Tensors also reachable from the frames' module globals (for a notebook cell, the user
    namespace) or from ``namespace`` would stay alive without it, so they are not counted.
    """
    frames = list(_frames(_last_traceback()))
    globals_: dict[int, Mapping] = {
        id(tb.tb_frame.f_globals): tb.tb_frame.f_globals for tb in frames
    }
    if namespace is not None:
        globals_[id(namespace)] = namespace
    elsewhere = _reachable_from(globals_.values())
    held = (
        v
        for tb in frames
        if tb.tb_frame.f_locals is not tb.tb_frame.f_globals
        for v in tb.tb_frame.f_locals.values()
        if isinstance(v, torch.Tensor)
        and not isinstance(v, nn.Parameter)
        and id(v) not in elsewhere
    )
    return len(frames), total_bytes(held)


def breakdown(
    model: nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    model_name: str | None = None,
    namespace: Mapping | None = None,
) -> MemoryReport:
    """Bytes of the model's parameters (trainable / frozen), buffers and gradients and of
    the optimizer's state on the model's device, with that device's totals; what the last
    traceback alone holds (``namespace``: the user's variables, which it does not own)."""
    device = _report_device(model)
    real = unwrap(model) if model is not None else None
    params = list(
        unique(
            itertools.chain(
                real.parameters() if real is not None else (),
                optimizer_params(optimizer) if optimizer is not None else (),
            )
        )
    )
    buffers = list(unique(real.buffers())) if real is not None else []
    grads = [p.grad for p in params if p.grad is not None]
    state = list(state_tensors(optimizer)) if optimizer is not None else []
    elsewhere = sum(nbytes(t) for t in (*params, *buffers, *grads, *state) if t.device != device)

    def here(tensors: Iterable[torch.Tensor]) -> int:
        return sum(nbytes(t) for t in tensors if t.device == device)

    frames, held = traceback_hold(namespace)
    in_use = reserved = peak = free = total = None
    source = ""
    if device.type == "cuda" and _cuda_used():
        source = "cuda allocator"
        in_use = torch.cuda.memory_allocated(device)
        reserved = torch.cuda.memory_reserved(device)
        peak = torch.cuda.max_memory_allocated(device)
        free, total = torch.cuda.mem_get_info(device)
    elif device.type == "cpu":
        source = "process RSS"
        in_use, peak = hostmem.rss(), hostmem.peak_rss()
        free, total = hostmem.machine_memory()
    return MemoryReport(
        model_name=model_name,
        device=str(device),
        source=source,
        params_trainable=here(p for p in params if p.requires_grad),
        params_frozen=here(p for p in params if not p.requires_grad),
        buffers=here(buffers),
        grads=here(grads),
        optimizer_state=here(state),
        elsewhere=elsewhere,
        in_use=in_use,
        reserved=reserved,
        peak=peak,
        free=free,
        total=total,
        traceback_frames=frames,
        traceback_bytes=held,
        full_finetune_state=None if real is None else full_finetune_state(real, optimizer),
    )


def reset_peaks(drop_tracebacks: bool = False, namespace: Mapping | None = None) -> ResetReport:
    """Start the peak counters again (every CUDA device in use, the process's peak RSS);
    with ``drop_tracebacks``, forget the last traceback so its frames' tensors can go
    (those ``namespace`` also reaches stay)."""
    peaks: list[str] = []
    if _cuda_used():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
            peaks.append(f"cuda:{index}")
    if hostmem.reset_peak_rss():
        peaks.append("cpu")
    frames = released = 0
    if drop_tracebacks:
        frames, released = traceback_hold(namespace)
        tb = _last_traceback()
        if tb is not None:
            traceback.clear_frames(tb)
        for name in ("last_traceback", "last_value", "last_type", "last_exc"):
            if hasattr(sys, name):
                setattr(sys, name, None)
        gc.collect()
    return ResetReport(tuple(peaks), frames, released)


class CellWatcher:
    """Memory in use before and after a cell, and the peak during it.

    Hook :meth:`pre` / :meth:`post` to IPython's ``pre_run_cell`` / ``post_run_cell``.
    The peak needs the device's peak counter, so each cell resets it: while watching,
    the breakdown's peak covers the last cell. CUDA is reported once it is in use,
    the process's resident set before that.
    """

    def __init__(self) -> None:
        self._start: tuple[str, int, bool] | None = None

    def pre(self) -> None:
        if _cuda_used():
            index = torch.cuda.current_device()
            torch.cuda.reset_peak_memory_stats(index)
            self._start = (f"cuda:{index}", torch.cuda.memory_allocated(index), True)
        else:
            self._start = ("cpu", hostmem.rss() or 0, hostmem.reset_peak_rss())

    def post(self) -> CellMemory | None:
        """The cell's figures, or None when :meth:`pre` did not run before it."""
        if self._start is None:
            return None
        device, before, peak_reset = self._start
        self._start = None
        if device.startswith("cuda"):
            index = int(device.partition(":")[2])
        elif _cuda_used():  # CUDA first used in this cell: it started at 0
            index, before = torch.cuda.current_device(), 0
        else:
            peak = hostmem.peak_rss() if peak_reset else None
            return CellMemory("cpu", before, hostmem.rss() or 0, peak)
        return CellMemory(
            f"cuda:{index}",
            before,
            torch.cuda.memory_allocated(index),
            torch.cuda.max_memory_allocated(index),
        )

    def stop(self) -> None:
        """Forget the cell being watched (the watch was switched off during it): the next
        :meth:`post` without a :meth:`pre` says nothing."""
        self._start = None
