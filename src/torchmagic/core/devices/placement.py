"""Where a model's tensors live, and which ones are not where its parameters are.

``model.to(device)`` moves registered parameters and buffers only. A tensor kept as a
plain attribute (``self.anchors = torch.zeros(…)``), alone or inside a list, tuple or dict,
stays behind and fails later with "Expected all tensors to be on the same device".
Optimizer state must sit with its parameter and a GradScaler with the loss.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..modules import parameter_names, unwrap
from ..surgery.optimizer_sync import step_stays_on_host

# How deep a plain attribute is searched for tensors (list of dicts of tensors: 2).
_ATTR_DEPTH = 3
# Containers longer than this are not searched item by item (a dataset kept on a module).
_ATTR_ITEMS = 1000


@dataclass(frozen=True)
class Misplaced:
    """One tensor that is not on the model's device."""

    name: str  # qualified: "layer1.0.anchors[2]", "optimizer.state[fc.weight].exp_avg"
    kind: str  # "parameter", "gradient", "buffer", "attribute", "optimizer state", "scaler"
    device: str
    shape: tuple[int, ...]
    nbytes: int
    fix: str


@dataclass(frozen=True)
class CheckReport:
    """The reference device (where most parameter bytes are) and what is elsewhere."""

    model_name: str
    reference: str | None  # None: the model has no tensors
    tensors: int  # how many tensors were looked at
    misplaced: tuple[Misplaced, ...]


def nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements; 0 for a lazy module's parameter not yet materialised."""
    return 0 if is_lazy(t) else t.numel() * t.element_size()


def reference_device(model: nn.Module) -> torch.device | None:
    """The device holding most of the model's parameter bytes (buffers if it has none)."""
    model = unwrap(model)
    weights: Counter = Counter()
    for p in model.parameters():
        weights[p.device] += nbytes(p) or 1
    if not weights:
        for b in model.buffers():
            weights[b.device] += nbytes(b) or 1
    return weights.most_common(1)[0][0] if weights else None


def _tensors_in(value: object, path: str, depth: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors in a plain attribute value: itself, or inside lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif depth and isinstance(value, (list, tuple)) and len(value) <= _ATTR_ITEMS:
        for i, item in enumerate(value):
            yield from _tensors_in(item, f"{path}[{i}]", depth - 1)
    elif depth and isinstance(value, dict) and len(value) <= _ATTR_ITEMS:
        for key, item in value.items():
            yield from _tensors_in(item, f"{path}[{key!r}]", depth - 1)


def plain_tensor_attributes(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors a module keeps outside ``_parameters`` / ``_buffers``: ``.to()`` skips them.

    Attributes that merely alias a registered tensor (RNN's ``_flat_weights``) are skipped.
    """
    model = unwrap(model)
    registered = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in ("_parameters", "_buffers", "_modules") or isinstance(value, nn.Module):
                continue
            qualified = f"{prefix}.{attr}" if prefix else attr
            for name, tensor in _tensors_in(value, qualified, _ATTR_DEPTH):
                if id(tensor) not in registered:
                    yield name, tensor


def _attribute_fix(name: str) -> str:
    if "[" in name:
        return (
            "register each tensor as a buffer (register_buffer(name, t, persistent=False)) "
            "or stack them into one buffer; model.to() skips tensors in lists and dicts"
        )
    attr = name.rpartition(".")[2]
    return (
        f"in __init__: self.register_buffer({attr!r}, tensor, persistent=False) "
        "so model.to() moves it"
    )


def _optimizer_misplaced(
    model: nn.Module, optimizer: torch.optim.Optimizer, label: str
) -> Iterator[Misplaced]:
    names = parameter_names(model)
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            state = optimizer.state.get(p)
            if not state:
                continue
            pname = names.get(id(p), f"<group {gi} param {pi}>")
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.device != p.device
                    and not step_stays_on_host(group, key)
                ):
                    yield Misplaced(
                        f"{label}.state[{pname}].{key}",
                        "optimizer state",
                        str(value.device),
                        tuple(value.shape),
                        nbytes(value),
                        f"%device move (moves optimizer state with its parameter to {p.device})",
                    )


def find_misplaced(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
    *,
    model_name: str = "model",
    optimizer_name: str = "optimizer",
) -> CheckReport:
    """Every tensor of the model, its optimizer and GradScaler that is not on the device
    holding most of the model's parameter bytes (optimizer state: not with its parameter)."""
    model = unwrap(model)
    ref = reference_device(model)
    if ref is None:
        return CheckReport(model_name, None, 0, ())
    found: list[Misplaced] = []
    tensors = 0
    move_fix = f"%device move (or {model_name}.to('{ref}'))"
    for name, p in model.named_parameters():
        tensors += 1
        if is_lazy(p):  # no data yet: it is created where the first input is
            continue
        if p.device != ref:
            found.append(
                Misplaced(name, "parameter", str(p.device), tuple(p.shape), nbytes(p), move_fix)
            )
        elif p.grad is not None and p.grad.device != ref:
            found.append(
                Misplaced(
                    f"{name}.grad",
                    "gradient",
                    str(p.grad.device),
                    tuple(p.grad.shape),
                    nbytes(p.grad),
                    f"{optimizer_name}.zero_grad() (set_to_none) drops it",
                )
            )
    for name, b in model.named_buffers():
        tensors += 1
        if b.device != ref:
            found.append(
                Misplaced(name, "buffer", str(b.device), tuple(b.shape), nbytes(b), move_fix)
            )
    for name, t in plain_tensor_attributes(model):
        tensors += 1
        if t.device != ref:
            found.append(
                Misplaced(
                    name,
                    "attribute",
                    str(t.device),
                    tuple(t.shape),
                    nbytes(t),
                    _attribute_fix(name),
                )
            )
    if optimizer is not None:
        tensors += sum(len(s) for s in optimizer.state.values())
        found.extend(_optimizer_misplaced(model, optimizer, optimizer_name))
    if scaler is not None and scaler.is_enabled():
        scale = scaler._scale
        tensors += 1
        if scale is not None and scale.device != ref:
            found.append(
                Misplaced(
                    "GradScaler._scale",
                    "scaler",
                    str(scale.device),
                    tuple(scale.shape),
                    nbytes(scale),
                    f"%device move (or a new torch.amp.GradScaler('{ref.type}'))",
                )
            )
        elif scale is None and scaler._device != ref.type:
            found.append(
                Misplaced(
                    "GradScaler",
                    "scaler",
                    scaler._device,
                    (),
                    0,
                    f"create it for the model's device: torch.amp.GradScaler('{ref.type}')",
                )
            )
    return CheckReport(model_name, str(ref), tensors, tuple(found))
