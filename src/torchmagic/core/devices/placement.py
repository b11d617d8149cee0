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

from ..advice import Advice, Advised, Call
from ..integrations.lookup import state_of
from ..modules import parameter_names, unwrap
from ..tensors import attribute_tensors, nbytes, state_entries

# How deep a plain attribute is searched for tensors (list of dicts of tensors: 2).
_ATTR_DEPTH = 3
# Containers longer than this are not searched item by item (a dataset kept on a module).
_ATTR_ITEMS = 1000


@dataclass(frozen=True)
class Misplaced(Advised):
    """One tensor that is not on the model's device."""

    name: str  # qualified: "layer1.0.anchors[2]", "optimizer.state[fc.weight].exp_avg"
    kind: str  # "parameter", "gradient", "buffer", "attribute", "optimizer state", "scaler"
    device: str
    shape: tuple[int, ...]
    nbytes: int
    advice: str | Advice  # the fix: text, with the commands in it as Calls


@dataclass(frozen=True)
class CheckReport:
    """The reference device (where most parameter bytes are) and what is elsewhere."""

    model_name: str
    reference: str | None  # None: the model has no tensors
    tensors: int  # how many tensors were looked at
    misplaced: tuple[Misplaced, ...]


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


def reference_dtype(model: nn.Module) -> torch.dtype | None:
    """The floating dtype holding most of the model's parameter bytes."""
    weights: Counter = Counter()
    for p in unwrap(model).parameters():
        if p.is_floating_point():
            weights[p.dtype] += nbytes(p) or 1
    return weights.most_common(1)[0][0] if weights else None


@dataclass(frozen=True)
class OddPart:
    """A module whose own parameters are not where, or not of the dtype, the rest is."""

    part: str  # as the user names it: "model.fc"
    kind: str  # "device" or "dtype"
    found: str  # "meta", "float64"
    expected: str  # "cpu", "float32"
    fix: str

    def what(self, model_name: str) -> str:
        where = "on " if self.kind == "device" else ""
        return (
            f"'{self.part}' is {where}{self.found} but the rest of '{model_name}' is "
            f"{where}{self.expected}"
        )

    def line(self, model_name: str) -> str:
        return f"{self.what(model_name)}; {self.fix}"


def odd_part(model: nn.Module, model_name: str) -> OddPart | None:
    """The first module whose own parameters are on another device or in another floating
    dtype than the rest of the model (a head moved by hand: ``model.fc.double()``,
    ``model.fc.to("meta")``), or None. Adapter layers (peft's) are not looked into, and
    float32 parts of a half-precision model are fine: both keep their dtype on purpose
    (transformers' ``_keep_in_fp32_modules``)."""
    model = unwrap(model)
    device, dtype = reference_device(model), reference_dtype(model)
    skipped: tuple[str, ...] = ()
    for name, module in model.named_modules():
        if name and name.startswith(skipped):
            continue
        if type(module).__module__.startswith("peft."):
            skipped = (*skipped, f"{name}.")
            continue
        part = f"{model_name}.{name}" if name else model_name
        for p in module.parameters(recurse=False):
            if p.device != device and not is_lazy(p):
                fix = (
                    "it holds no weights any more: replace it again (replace_head) or "
                    "rebuild the model"
                    if p.device.type == "meta"
                    else f"move it back ({part}.to('{device}')) or move the whole model"
                )
                return OddPart(part, "device", str(p.device), str(device), fix)
            if p.is_floating_point() and p.dtype != dtype and not _kept_wider(p.dtype, dtype):
                kind = str(dtype).removeprefix("torch.")
                fix = f"cast it back ({part}.to(torch.{kind})) or cast the whole model"
                return OddPart(part, "dtype", str(p.dtype).removeprefix("torch."), kind, fix)
    return None


def _kept_wider(part: torch.dtype, model: torch.dtype | None) -> bool:
    return part == torch.float32 and model in (torch.float16, torch.bfloat16)


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
    for entry in state_entries(optimizer):
        if not entry.misplaced:
            continue
        p, value = entry.param, entry.value
        pname = names.get(id(p), f"<group {entry.group_index} param {entry.param_index}>")
        yield Misplaced(
            f"{label}.state[{pname}].{entry.key}",
            "optimizer state",
            str(value.device),
            tuple(value.shape),
            nbytes(value),
            (
                Call("move", mention=True),
                f" (moves optimizer state with its parameter to {p.device})",
            ),
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
    move_fix = (Call("move", mention=True), f" (or {model_name}.to('{ref}'))")
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
    for name, t in attribute_tensors(model, depth=_ATTR_DEPTH, max_items=_ATTR_ITEMS):
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
        tensors += sum(len(s) for s in state_of(optimizer).values())
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
                    (Call("move", mention=True), f" (or a new torch.amp.GradScaler('{ref.type}'))"),
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
