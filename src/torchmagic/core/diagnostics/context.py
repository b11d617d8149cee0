"""What every doctor check reads, gathered once per scan.

The namespace is seen read only (nothing is resolved or remembered): its models, their
optimizers and the active GradScalers are looked up once and shared by all the checks,
beside the session's state the scan was given.
"""

from __future__ import annotations

import types
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from ..modules import unwrap
from ..surgery.history import History
from ..tensors import leaves, optimizer_params, owners
from ..workspace import Workspace
from .compiled import CompileWatch

NamedOptimizer = tuple[str, torch.optim.Optimizer]


class AmpState(Protocol):
    """The session's mixed-precision policy (``core.amp.AmpController`` fits)."""

    enabled: bool
    dtype: torch.dtype | None
    device_type: str


@dataclass(frozen=True)
class ModelEntry:
    """A model bound in the namespace, seen through its wrappers, with the optimizers that
    hold any of its parameters (none: nothing trains it)."""

    name: str
    module: nn.Module
    optimizers: list[NamedOptimizer]


@dataclass(frozen=True)
class DoctorContext:
    """One scan's shared reading of the namespace and the session, so each check looks
    nothing up twice."""

    ws: Workspace
    models: tuple[ModelEntry, ...]
    optimizers: list[NamedOptimizer]
    scalers: list[torch.amp.GradScaler]  # enabled ones, each once
    orphans: Mapping[str, int]  # optimizer name → its tensors the user cannot reach
    amp: AmpState | None
    compile_watch: CompileWatch | None
    device: torch.device | None  # the session's device
    weights: Mapping[str, object]  # model name → the weights load_model built it with
    replaced_heads: Container[str]  # models whose head the session replaced
    fits: Sequence[object]  # the session's runs, the newest last
    pinbench: object | None  # the last pinbench report
    history: History | None  # the session's undo history

    @property
    def trained(self) -> dict[str, nn.Module]:
        """Model name → model, for the models an optimizer trains."""
        return {m.name: m.module for m in self.models if m.optimizers}


def gather(
    ws: Workspace,
    *,
    amp: AmpState | None,
    scaler: torch.amp.GradScaler | None,
    compile_watch: CompileWatch | None,
    device: torch.device | None,
    weights: Mapping[str, object],
    replaced_heads: Container[str],
    fits: Sequence[object],
    pinbench: object | None,
    history: History | None,
) -> DoctorContext:
    """The context of one scan: the session's scaler and AMP policy's scaler join those
    bound in the namespace."""
    bound = ws.models()
    optimizers = ws.optimizers()
    models = []
    for name, value in bound.items():
        model = unwrap(value)
        models.append(ModelEntry(name, model, owners(optimizers, model.parameters())))
    found_scalers = [scaler, getattr(amp, "scaler", None), *ws.scalers()]
    scalers = list({id(s): s for s in found_scalers if s is not None and s.is_enabled()}.values())
    return DoctorContext(
        ws,
        tuple(models),
        optimizers,
        scalers,
        _orphans(ws, optimizers),
        amp,
        compile_watch,
        device,
        weights,
        replaced_heads,
        fits,
        pinbench,
        history,
    )


def _reachable_ids(ws: Workspace) -> set[int]:
    """``id`` of every tensor the user can reach: bound to a variable, in a module, list,
    tuple or dict bound to one, or an attribute of an object bound to one
    (``trainer.model``)."""
    found: set[int] = set()
    for _, value in ws.items():
        if isinstance(value, (torch.optim.Optimizer, type, types.ModuleType)):
            continue
        values = [value]
        if not isinstance(value, (nn.Module, torch.Tensor, list, tuple, dict)):
            try:
                values += list(vars(value).values())
            except TypeError:  # no __dict__
                pass
        for item in values:
            for leaf in leaves(item, depth=1, kind=(nn.Module, torch.Tensor)):
                if isinstance(leaf, nn.Module):
                    found.update(id(p) for p in leaf.parameters())
                else:
                    found.add(id(leaf))
    return found


def _orphans(ws: Workspace, optimizers: list[NamedOptimizer]) -> dict[str, int]:
    """Optimizer name → how many of its tensors the user cannot reach any more (left over
    from a model that was re-created: the model cell re-run, not the optimizer cell)."""
    bound = _reachable_ids(ws)
    found = {}
    for opt_name, opt in optimizers:
        left = sum(id(p) not in bound for p in optimizer_params(opt))
        if left:
            found[opt_name] = left
    return found
