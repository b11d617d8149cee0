"""Sharded tensors (FSDP2's DTensor parameters and the optimizer state made from them)
where the engine handles tensors: the memory this rank really holds, and a copy on the
host that comes back as the same sharded tensor.

A DTensor is a wrapper: ``untyped_storage()`` on it raises ("invalid python storage") and
``numel()`` is the global size, while the rank holds only its local shard. Classes are
recognised by name and torch.distributed.tensor is imported only when one is met, so a
plain session never loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def is_dtensor(value: object) -> bool:
    """By class name: DTensor lives in different modules across torch versions."""
    return any(cls.__name__ == "DTensor" for cls in type(value).__mro__)


def storages(t: torch.Tensor) -> Iterator[tuple[tuple[torch.device, int], int]]:
    """((device, data pointer), bytes) of each storage ``t`` keeps alive on this rank:
    its own, or those of the tensors a wrapper subclass holds (a DTensor's local shard)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):  # a DTensor also lists its device mesh
                yield from storages(inner)
        return
    storage = t.untyped_storage()
    yield (t.device, storage.data_ptr()), storage.nbytes()


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes of the elements this rank holds (a DTensor's local shard, else all)."""
    held = _local(t) if is_dtensor(t) else t
    return held.numel() * held.element_size()


@dataclass(frozen=True)
class HostShard:
    """A DTensor's local shard on the host, with what makes it the same DTensor again."""

    local: torch.Tensor
    mesh: Any
    placements: tuple
    shape: torch.Size
    stride: tuple[int, ...]

    def back(self, device: torch.device | str) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            self.local.to(device),
            self.mesh,
            self.placements,
            run_check=False,
            shape=self.shape,
            stride=self.stride,
        )


def to_host(t: torch.Tensor) -> torch.Tensor | HostShard:
    """``t`` on the host: a plain tensor moved (the same object when already there), a
    DTensor as its local shard (its mesh's device stays what it is)."""
    if not is_dtensor(t):
        return t.to("cpu")
    return HostShard(
        _local(t).to("cpu"),
        t.device_mesh,  # type: ignore[attr-defined]
        tuple(t.placements),  # type: ignore[attr-defined]
        t.shape,
        t.stride(),
    )


def from_host(kept: object, device: torch.device | str) -> object:
    """What :func:`to_host` kept, on ``device`` again (a DTensor as a DTensor); any other
    value as it is."""
    if isinstance(kept, HostShard):
        return kept.back(device)
    return kept.to(device) if isinstance(kept, torch.Tensor) else kept


def held(kept: torch.Tensor | HostShard) -> torch.Tensor:
    """The host tensor that :func:`to_host` keeps alive."""
    return kept.local if isinstance(kept, HostShard) else kept


def _local(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return t.to_local()  # type: ignore[attr-defined]
