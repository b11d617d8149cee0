"""``%tm doctor``: the classic transfer-learning mistakes, found in the live namespace.

Each check reads the live objects (models, optimizers, schedulers, GradScalers, the
session's AMP policy) and reports what is wrong, how bad it is, and a one-line fix. Nothing
is changed. A healthy session reports nothing.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..devices.memory import state_bytes
from ..devices.placement import find_misplaced, reference_device
from ..modules import parameter_names, unwrap
from ..surgery import scheduler_sync
from ..surgery.batchnorm import is_held
from ..workspace import Workspace
from .compiled import CompileWatch, is_compiled

SEVERITIES = ("error", "warning", "info")
# How many items of a list / dict in the namespace are searched for graph-holding tensors
# (the newest ones: a leak appends).
LEAK_SCAN_ITEMS = 10_000


class AmpState(Protocol):
    """The session's mixed-precision policy (``core.amp.AmpController`` fits)."""

    enabled: bool
    dtype: torch.dtype | None
    device_type: str


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str  # "error" (wrong results or a crash), "warning" (waste), "info"
    subject: str
    message: str
    fix: str
    nbytes: int = 0  # memory the problem holds, when known


@dataclass(frozen=True)
class DoctorReport:
    findings: tuple[Finding, ...]  # most severe first
    scanned: tuple[str, ...]  # what was looked at: "model (ResNet)", "optimizer (AdamW)"


def _names(names: list[str], shown: int = 3) -> str:
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f" and {len(names) - shown} more"


def _blocks(model_name: str, param_names: Iterable[str]) -> str:
    """``%freeze`` / ``%unfreeze`` targets covering these parameters: their top-level
    blocks (``model.layer1 model.fc``)."""
    tops = list(dict.fromkeys(n.split(".")[0] for n in param_names))
    return " ".join(f"{model_name}.{t}" for t in tops[:4]) + (" …" if len(tops) > 4 else "")


def _held(optimizers: list[tuple[str, torch.optim.Optimizer]]) -> set[int]:
    return {id(p) for _, o in optimizers for g in o.param_groups for p in g["params"]}


# -- 1, 2: parameters and the optimizer ----------------------------------------------


def _unoptimized(name: str, model: nn.Module, opts: list) -> Iterator[Finding]:
    held = _held(opts)
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if not missing:
        return
    opt_names = " / ".join(n for n, _ in opts)
    yield Finding(
        "unoptimized",
        "error",
        f"{name}: {_names(missing)}",
        f"{len(missing)} trainable tensor(s) are in no param group of {opt_names}: they get "
        "gradients but never change",
        f"%unfreeze {_blocks(name, missing)} lr=… (adds them to {opts[0][0]} as a param group)",
    )


def _frozen_in_optimizer(name: str, model: nn.Module, opts: list) -> Iterator[Finding]:
    names = parameter_names(model)
    for opt_name, opt in opts:
        inside = [
            p
            for g in opt.param_groups
            for p in g["params"]
            if id(p) in names and not p.requires_grad
        ]
        graded = [names[id(p)] for p in inside if p.grad is not None]
        if graded:
            yield Finding(
                "frozen-in-optimizer",
                "error",
                f"{name}: {_names(graded)}",
                f"{len(graded)} frozen tensor(s) in {opt_name} still have a .grad (zeros or "
                "stale): every step applies it, with momentum and weight decay, so they move",
                f"%freeze {_blocks(name, graded)} (takes them out of {opt_name}), or "
                f"{opt_name}.zero_grad(set_to_none=True)",
            )
        stateful = [p for p in inside if opt.state.get(p)]
        if stateful:
            yield Finding(
                "frozen-in-optimizer",
                "warning",
                f"{name}: {_names([names[id(p)] for p in stateful])}",
                f"{len(stateful)} frozen tensor(s) still in {opt_name} hold optimizer state",
                f"%freeze {_blocks(name, [names[id(p)] for p in stateful])} "
                "(frees the state; %tm undo brings it back)",
                state_bytes(opt, stateful),
            )


# -- 3: BatchNorm --------------------------------------------------------------------


def _frozen(module: nn.Module) -> bool:
    params = list(module.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


def _bn_drift(name: str, model: nn.Module) -> Iterator[Finding]:
    """BatchNorm layers of frozen blocks still updating their running statistics: their
    own parameters frozen (or, without affine parameters, their parent's), in train mode,
    and not held in eval by torchmagic's ``%freeze``."""
    modules = dict(model.named_modules())
    drifting = []
    for qualified, m in modules.items():
        if not (isinstance(m, _BatchNorm) and m.training and m.track_running_stats):
            continue
        if is_held(m):
            continue
        own = list(m.parameters(recurse=False))
        parent = modules[qualified.rpartition(".")[0]]
        if (own and not any(p.requires_grad for p in own)) or (not own and _frozen(parent)):
            drifting.append(qualified)
    if drifting:
        yield Finding(
            "bn-drift",
            "warning",
            f"{name}: {_names(drifting)}",
            f"{len(drifting)} BatchNorm layer(s) in frozen blocks are in train mode: their "
            "running statistics keep moving (ignore if you chose --bn train)",
            f"%freeze {_blocks(name, drifting)} holds them in eval, also after {name}.train()",
        )


# -- 4: devices ----------------------------------------------------------------------


def _devices(name: str, model: nn.Module, opts: list, scalers: list) -> Iterator[Finding]:
    misplaced: dict = {}
    for opt_name, opt in opts or [(None, None)]:
        for scaler in (scalers or [None]) if opts else [None]:
            report = find_misplaced(
                model, opt, scaler, model_name=name, optimizer_name=opt_name or "optimizer"
            )
            misplaced.update(dict.fromkeys(report.misplaced))
            reference = report.reference
    groups: dict[tuple, list] = {}
    for m in misplaced:
        key = (m.kind, m.device, m.name if m.kind == "attribute" else "")
        groups.setdefault(key, []).append(m)
    for (kind, device, _), items in groups.items():
        yield Finding(
            "device",
            "error",
            f"{name}: {_names([m.name for m in items])}",
            f"{len(items)} {kind} tensor(s) on {device}, the model is on {reference}",
            items[0].fix,
            sum(m.nbytes for m in items),
        )


def _off_session_device(name: str, model: nn.Module, device: torch.device) -> Iterator[Finding]:
    where = reference_device(model)
    if where is not None and where != device:
        yield Finding(
            "device",
            "warning",
            name,
            f"{name} is on {where} but the session device is {device}",
            f"%device move {name} (model, optimizer state and GradScaler together)",
        )


# -- 5: mixed precision --------------------------------------------------------------


def _half_params(model: nn.Module) -> bool:
    return any(p.dtype == torch.float16 for p in model.parameters())


def _amp(amp: AmpState | None, models: Mapping[str, nn.Module], scalers: list) -> Iterator[Finding]:
    """``models``: those an optimizer trains (a frozen fp16 teacher is fine)."""
    if amp is not None and amp.enabled and amp.dtype == torch.float16:
        if amp.device_type == "cpu":
            yield Finding(
                "amp",
                "warning",
                "autocast",
                "fp16 autocast on the CPU: slow, and fp16 needs loss scaling",
                "%amp on bf16 (bfloat16 keeps fp32's range)",
            )
    if not scalers:
        return
    if amp is not None and amp.enabled and amp.dtype == torch.bfloat16:
        yield Finding(
            "amp",
            "warning",
            "GradScaler",
            "a GradScaler with bf16 autocast: bf16 has fp32's range, scaling only costs time",
            "drop the scaler (or %amp on bf16, which uses none)",
        )
    for name, model in models.items():
        if _half_params(model):
            yield Finding(
                "amp",
                "error",
                name,
                f"{name} was cast to fp16 (.half()) while a GradScaler is active: unscaling "
                "fp16 gradients fails, and fp16 weights lose small updates",
                f"{name}.float(), and let autocast run the fp16 maths (%amp on fp16)",
            )


# -- 6: schedulers -------------------------------------------------------------------


def _schedulers(ws: Workspace, optimizers: list) -> Iterator[Finding]:
    bound = set()
    for opt_name, opt in optimizers:
        n = len(opt.param_groups)
        for s in ws.schedulers(opt):
            bound.add(id(s))
            kind = type(s).__name__
            wrong = scheduler_sync.mismatches(s, opt)
            if wrong:
                yield Finding(
                    "scheduler",
                    "error",
                    f"{kind} on {opt_name}",
                    f"{'; '.join(wrong)} for {n} param groups: the next "
                    "scheduler.step() fails or schedules the wrong groups",
                    f"recreate the scheduler over {opt_name}; %unfreeze/%replace_head keep "
                    "it in step from then on",
                )
            reason = scheduler_sync.unfollowable(s, opt)
            if reason:
                yield Finding(
                    "scheduler",
                    "warning",
                    f"{kind} on {opt_name}",
                    f"{kind} holds {opt_name} but {reason}: %unfreeze with lr= and "
                    "%replace_head refuse to add a param group while it is bound",
                    "%unfreeze without lr= (parameters return to their home groups), or "
                    f"recreate the {kind} after the surgery",
                )
    everything = scheduler_sync.flatten(
        v for _, value in ws.items() for v in _members(value) if scheduler_sync.is_scheduler(v)
    )
    for s in everything:
        if id(s) not in bound:
            yield Finding(
                "scheduler",
                "warning",
                type(s).__name__,
                f"{type(s).__name__} drives an optimizer no variable holds any more (the "
                "optimizer was recreated?): the one you train is not scheduled",
                "recreate the scheduler over the current optimizer",
            )


def _members(value: object) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, dict):
        return list(value.values())
    return [value]


# -- 7: graphs kept alive ------------------------------------------------------------


def _graph_tensors(value: object, depth: int = 2) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.grad_fn is not None)
    if depth and isinstance(value, (list, tuple)):
        return sum(_graph_tensors(v, depth - 1) for v in value[-LEAK_SCAN_ITEMS:])
    if depth and isinstance(value, dict):
        items = list(value.values())[-LEAK_SCAN_ITEMS:]
        return sum(_graph_tensors(v, depth - 1) for v in items)
    return 0


def _leaks(ws: Workspace) -> Iterator[Finding]:
    for name, value in ws.items():
        if not isinstance(value, (list, tuple, dict)):
            continue
        found = _graph_tensors(value)
        if found:
            yield Finding(
                "graph-leak",
                "warning",
                name,
                f"{name} keeps {found} tensor(s) with a grad_fn: each keeps its whole autograd "
                "graph (activations) alive, so memory grows every step",
                f"store loss.item() (or loss.detach()) in {name}, and rebuild it from "
                "such values to free what it holds now",
            )


# -- 8: wrappers ---------------------------------------------------------------------


def _wrappers(ws: Workspace, watch: CompileWatch | None) -> Iterator[Finding]:
    for name, value in ws.items():
        if not isinstance(value, nn.Module):
            continue
        if isinstance(value, nn.DataParallel):
            yield Finding(
                "data-parallel",
                "warning",
                name,
                "nn.DataParallel: one process driving every GPU through threads, slower than "
                "DistributedDataParallel even on one machine",
                "DistributedDataParallel, launched with torchrun (one process per GPU)",
            )
        if watch is not None and is_compiled(value):
            changes = "; ".join(f"{what} {_names(names)}" for what, names in watch.changes(value))
            if changes:
                yield Finding(
                    "compiled-changed",
                    "warning",
                    name,
                    f"{name} changed after torch.compile ({changes}): every change "
                    "recompiles, and past the recompile limit it runs eagerly",
                    f"call torch.compile again after the surgery and rebind {name} (or compile "
                    "once, after the last change)",
                )


# -- the scan ------------------------------------------------------------------------


def diagnose(
    namespace: Mapping,
    *,
    hidden: Container[str] = (),
    amp: AmpState | None = None,
    scaler: torch.amp.GradScaler | None = None,
    compile_watch: CompileWatch | None = None,
    device: torch.device | None = None,
) -> DoctorReport:
    """Run every check over the namespace and the session's state: its AMP policy and
    scaler, its device (``%device``; models being trained elsewhere are named) and its
    :class:`CompileWatch` (without one, compiled models cannot be compared to what they
    were; it observes this namespace afterwards)."""
    ws = Workspace(namespace, hidden)  # read only: nothing is resolved or remembered
    models = ws.models()
    optimizers = ws.optimizers()
    found_scalers = [scaler, getattr(amp, "scaler", None)] + [
        v for _, v in ws.items() if isinstance(v, torch.amp.GradScaler)
    ]
    scalers = list({id(s): s for s in found_scalers if s is not None and s.is_enabled()}.values())
    findings: list[Finding] = []
    trained: dict[str, nn.Module] = {}
    for name, value in models.items():
        model = unwrap(value)
        ids = {id(p) for p in model.parameters()}
        opts = [
            (n, o)
            for n, o in optimizers
            if any(id(p) in ids for g in o.param_groups for p in g["params"])
        ]
        if opts:
            trained[name] = model
            findings += _unoptimized(name, model, opts)
            findings += _frozen_in_optimizer(name, model, opts)
            if device is not None:
                findings += _off_session_device(name, model, device)
        findings += _bn_drift(name, model)
        findings += _devices(name, model, opts, scalers)
    findings += _amp(amp, trained, scalers)
    findings += _schedulers(ws, optimizers)
    findings += _leaks(ws)
    findings += _wrappers(ws, compile_watch)
    if compile_watch is not None:
        compile_watch.observe(namespace, hidden)
    scanned = [f"{n} ({type(unwrap(m)).__name__})" for n, m in models.items()]
    scanned += [f"{n} ({type(o).__name__})" for n, o in optimizers]
    scanned += [f"GradScaler ({s._device})" for s in scalers]
    if amp is not None:
        scanned.append("AMP " + ("on" if amp.enabled else "off"))
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return DoctorReport(tuple(findings), tuple(scanned))
