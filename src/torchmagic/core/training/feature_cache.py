"""Linear probing without recomputing a frozen backbone: run it once over the loader,
keep the head's inputs per sample, and train the head on them.

Only valid when the backbone computes the same features every epoch, so every condition
is checked up front and a refusal says which one failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from ..errors import TorchMagicError
from ..modules import is_batchnorm
from ..surgery import batchnorm, heads
from ..tensors import nbytes
from .data import call_model, random_transforms


@dataclass(frozen=True)
class CachedHead:
    """The trainable head and its qualified name; everything else is a frozen backbone."""

    name: str
    module: nn.Module


def _all_trainable(module: nn.Module) -> bool:
    params = list(module.parameters())
    return bool(params) and all(p.requires_grad for p in params)


def locate_head(model: nn.Module) -> CachedHead:
    """The head found by the usual conventions, widened to the largest enclosing module
    that is entirely trainable (so a ``Sequential(Dropout, Linear)`` head keeps its
    dropout on the cached side)."""
    head = heads.find_head(model)
    name = head.name
    while name:
        parent_name = name.rpartition(".")[0]
        parent = model.get_submodule(parent_name) if parent_name else model
        if parent is model or not _all_trainable(parent):
            break
        name = parent_name
    return CachedHead(name, model.get_submodule(name))


def _is_random_layer(module: nn.Module) -> bool:
    p = getattr(module, "p", 0)
    dropout = isinstance(module, nn.modules.dropout._DropoutNd) or (
        type(module).__name__ == "StochasticDepth"
    )
    return dropout and isinstance(p, float) and p > 0


def check_cacheable(model: nn.Module, loaders: list[DataLoader]) -> CachedHead:
    """Refuse unless the backbone's output is the same every epoch."""
    head = locate_head(model)
    inside = {id(p) for p in head.module.parameters()}
    outside = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        shown = ", ".join(outside[:4]) + (" …" if len(outside) > 4 else "")
        raise TorchMagicError(
            f"cache_features needs everything before the head ({head.name}) frozen, but "
            f"{shown} train; freeze them first",
            param="cache_features",
        )
    head_modules = {id(m) for m in head.module.modules()}
    for name, module in model.named_modules():
        if id(module) in head_modules:
            continue
        if is_batchnorm(module) and batchnorm.mode(module) not in ("held", "frozen"):
            raise TorchMagicError(
                f"cache_features: BatchNorm {name} would run in train mode and move its "
                "statistics; freeze its block with bn='eval' (or 'frozen') first",
                param="cache_features",
            )
        if _is_random_layer(module):
            raise TorchMagicError(
                f"cache_features: {name} ({type(module).__name__}, p={module.p}) before the "
                "head makes the features random in training",
                param="cache_features",
            )
    for loader in loaders:
        if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
            raise TorchMagicError(
                "cache_features needs DataLoaders over map-style datasets (it caches by index)",
                param="cache_features",
            )
        random = random_transforms(loader.dataset)
        if random:
            raise TorchMagicError(
                f"cache_features: the dataset's transform has random augmentation "
                f"({', '.join(random)}): features would differ every epoch",
                param="cache_features",
            )
    return head


class FeatureStore:
    """The head's inputs by dataset index, on the device when they fit, else on the host."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        self.device = device
        self.features: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None

    def _allocate(
        self, features: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        per_sample = nbytes(features[0])
        where = torch.device("cpu")
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if per_sample * self.size < free // 2:
                where = self.device
        pin = where.type == "cpu" and self.device.type == "cuda"
        self.features = torch.empty(
            (self.size, *features.shape[1:]),
            dtype=features.dtype,
            device=where,
            pin_memory=pin,
        )
        self.targets = torch.empty(
            (self.size, *targets.shape[1:]), dtype=targets.dtype, device=where, pin_memory=pin
        )
        return self.features, self.targets

    def put(self, indices: list[int], features: torch.Tensor, targets: torch.Tensor) -> None:
        if self.features is None or self.targets is None:
            stored_features, stored_targets = self._allocate(features, targets)
        else:
            stored_features, stored_targets = self.features, self.targets
        index = torch.as_tensor(indices, device=stored_features.device)
        stored_features[index] = features.detach().to(stored_features.device)
        stored_targets[index] = targets.to(stored_targets.device)

    def get(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored features and targets of ``indices``, on the training device."""
        if self.features is None or self.targets is None:
            raise RuntimeError("FeatureStore.get before any put")
        index = torch.as_tensor(indices, device=self.features.device)
        blocking = self.features.device == self.device
        return (
            self.features[index].to(self.device, non_blocking=not blocking),
            self.targets[index].to(self.device, non_blocking=not blocking),
        )


def capture_head_input(
    model: nn.Module, head: nn.Module, inputs
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the model once; return the head's input and the model's output."""
    captured: list[torch.Tensor] = []

    def hook(module: nn.Module, args: tuple) -> None:
        captured.append(args[0])

    handle = head.register_forward_pre_hook(hook)
    try:
        output = call_model(model, inputs)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise TorchMagicError(
            f"cache_features: the head ran {len(captured)} times in one forward pass; only a "
            "head that runs once can be cached",
            param="cache_features",
        )
    return captured[0], output
