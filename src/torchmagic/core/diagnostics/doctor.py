"""Doctor: the classic transfer-learning mistakes, found in the live namespace.

Each check reads the live objects (models, optimizers, schedulers, GradScalers, the
session's AMP policy) and reports what is wrong, how bad it is, and a one-line fix. Nothing
is changed. A healthy session reports nothing.
"""

from __future__ import annotations

import os
import types
from collections.abc import Container, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..advice import PLACEHOLDER, Advice, Advised, Call
from ..devices.placement import find_misplaced, reference_device
from ..errors import TorchMagicError
from ..modules import parameter_names, unwrap
from ..surgery import scheduler_sync
from ..surgery.batchnorm import is_held
from ..surgery.heads import Head, find_head
from ..tensors import held_ids, leaves, optimizer_params, owners, state_bytes
from ..workspace import Workspace, parameter_shapes
from ..zoo import WeightsInfo, describe, expected_inputs, is_weights
from . import datasets
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
class Finding(Advised):
    check: str
    severity: str  # "error" (wrong results or a crash), "warning" (waste), "info"
    subject: str
    message: str
    advice: str | Advice  # the fix: text, with the commands in it as Calls
    nbytes: int = 0  # memory the problem holds, when known


@dataclass(frozen=True)
class DoctorReport:
    findings: tuple[Finding, ...]  # most severe first
    scanned: tuple[str, ...]  # what was looked at: "model (ResNet)", "optimizer (AdamW)"


def _names(names: list[str], shown: int = 3) -> str:
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f" and {len(names) - shown} more"


def _blocks(method: str, model_name: str, param_names: Iterable[str], **options: str) -> Call:
    """A freeze / unfreeze of the top-level blocks covering these parameters
    (``model.layer1``, ``model.fc``), the first four named."""
    tops = list(dict.fromkeys(n.split(".")[0] for n in param_names))
    targets = tuple(f"{model_name}.{t}" for t in tops[:4])
    return Call(method, targets, tuple(options.items()), more=len(tops) > 4)


# -- 1, 2: parameters and the optimizer ----------------------------------------------


def _recreate(opt_name: str, opt: torch.optim.Optimizer, model_name: str) -> str:
    return f"{opt_name} = torch.optim.{type(opt).__name__}({model_name}.parameters(), lr=…)"


def _unoptimized(
    name: str, model: nn.Module, opts: list, stale: Container[str]
) -> Iterator[Finding]:
    """Trainable tensors no optimizer of the model holds; ``stale``: optimizers that also
    hold another model's tensors, which are re-created rather than added to."""
    held = held_ids(o for _, o in opts)
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if not missing:
        return
    opt_names = " / ".join(n for n, _ in opts)
    mixed = [(n, o) for n, o in opts if n in stale]
    fix = (
        f"re-create {mixed[0][0]} over {name} ({_recreate(*mixed[0], name)}): it also holds "
        "parameters of a model no variable names"
        if mixed
        else (
            _blocks("unfreeze", name, missing, lr=PLACEHOLDER),
            f" (adds them to {opts[0][0]} as a param group)",
        )
    )
    yield Finding(
        "unoptimized",
        "error",
        f"{name}: {_names(missing)}",
        f"{len(missing)} trainable tensor(s) are in no param group of {opt_names}: they get "
        "gradients but never change",
        fix,
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


def _orphans(ws: Workspace, optimizers: list) -> dict[str, int]:
    """Optimizer name → how many of its tensors the user cannot reach any more (left over
    from a model that was re-created: the model cell re-run, not the optimizer cell)."""
    bound = _reachable_ids(ws)
    found = {}
    for opt_name, opt in optimizers:
        left = sum(id(p) not in bound for p in optimizer_params(opt))
        if left:
            found[opt_name] = left
    return found


def _stale_optimizers(
    models: Mapping[str, nn.Module], optimizers: list, orphans: Mapping[str, int]
) -> Iterator[Finding]:
    """Optimizers training a model no variable names: alone (the model was re-created
    after the optimizer) or beside a bound model's tensors (two models in one optimizer).
    The fix is a new optimizer, never adding the new model's parameters to the old one."""
    untrained = [n for n, m in models.items() if not owners(optimizers, unwrap(m).parameters())]
    for opt_name, opt in optimizers:
        left = orphans.get(opt_name)
        if not left:
            continue
        mine = [n for n, m in models.items() if owners([(opt_name, opt)], unwrap(m).parameters())]
        if mine:
            message = (
                f"{opt_name} holds {left} tensor(s) of a model no variable names besides "
                f"those of {', '.join(mine)}: two models in one optimizer (parameters added "
                "to it after the model was re-created)"
            )
            target = mine[0]
        elif untrained:
            message = (
                f"{opt_name} holds {left} tensor(s) of a model no variable names and none of "
                f"{', '.join(untrained)}'s: the model was re-created after {opt_name} (re-running "
                "the model cell makes new parameters), so stepping it trains nothing you hold"
            )
            target = untrained[0]
        else:
            continue
        yield Finding(
            "stale-optimizer",
            "error",
            opt_name,
            message,
            f"re-create it: {_recreate(opt_name, opt, target)} (adding {target}'s parameters "
            "to it would mix two models)",
        )


def _frozen_in_optimizer(name: str, model: nn.Module, opts: list) -> Iterator[Finding]:
    names = parameter_names(model)
    for opt_name, opt in opts:
        inside = [p for p in optimizer_params(opt) if id(p) in names and not p.requires_grad]
        graded = [names[id(p)] for p in inside if p.grad is not None]
        if graded:
            yield Finding(
                "frozen-in-optimizer",
                "error",
                f"{name}: {_names(graded)}",
                f"{len(graded)} frozen tensor(s) in {opt_name} still have a .grad (zeros or "
                "stale): every step applies it, with momentum and weight decay, so they move",
                (
                    _blocks("freeze", name, graded),
                    f" (takes them out of {opt_name}), or {opt_name}.zero_grad(set_to_none=True)",
                ),
            )
        stateful = [p for p in inside if opt.state.get(p)]
        if stateful:
            yield Finding(
                "frozen-in-optimizer",
                "warning",
                f"{name}: {_names([names[id(p)] for p in stateful])}",
                f"{len(stateful)} frozen tensor(s) still in {opt_name} hold optimizer state",
                (
                    _blocks("freeze", name, [names[id(p)] for p in stateful]),
                    " (frees the state; ",
                    Call("undo"),
                    " brings it back)",
                ),
                state_bytes(opt, stateful),
            )


def _state_shapes(name: str, model: nn.Module, opts: list) -> Iterator[Finding]:
    """Optimizer state of another shape than its parameter: an ``optimizer.state_dict()``
    loaded by hand into an optimizer whose groups are in another order (state goes by
    position) put one parameter's moments on another; the next step crashes or, where
    the shapes happen to agree, trains with the wrong state."""
    names = parameter_names(model)
    for opt_name, opt in opts:
        wrong = [
            names[id(p)]
            for p in optimizer_params(opt)
            if id(p) in names
            and any(
                isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != p.shape
                for v in opt.state.get(p, {}).values()
            )
        ]
        if wrong:
            yield Finding(
                "state-shape",
                "error",
                f"{name}: {_names(wrong)}",
                f"{len(wrong)} tensor(s) in {opt_name} hold optimizer state of another shape "
                "(a state_dict loaded by position into other param groups): the next step "
                "fails or trains with another parameter's state",
                (
                    "save where it trained with ",
                    Call("save", ("PATH",)),
                    f" and continue with torchmagic.resume(PATH, {name}, {opt_name}) (here: ",
                    Call("load", ("PATH",)),
                    f" on a fresh {name} and {opt_name}): states go by parameter name",
                ),
            )


# -- 3: BatchNorm --------------------------------------------------------------------


def _frozen(module: nn.Module) -> bool:
    params = list(module.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


def _bn_drift(name: str, model: nn.Module) -> Iterator[Finding]:
    """BatchNorm layers of frozen blocks still updating their running statistics: their
    own parameters frozen (or, without affine parameters, their parent's), in train mode,
    and not held in eval by torchmagic's freeze."""
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
            "running statistics keep moving (ignore if you chose bn='train')",
            (_blocks("freeze", name, drifting), f" holds them in eval, also after {name}.train()"),
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
            items[0].advice,
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
            (
                Call("move", (name,)),
                f" moves {name}, its optimizer state and GradScaler together (or "
                f"{name}.to('{device}'))",
            ),
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
                (Call("amp_on", ("bf16",)), " (bfloat16 keeps fp32's range)"),
            )
    if not scalers:
        return
    if amp is not None and amp.enabled and amp.dtype == torch.bfloat16:
        yield Finding(
            "amp",
            "warning",
            "GradScaler",
            "a GradScaler with bf16 autocast: bf16 has fp32's range, scaling only costs time",
            ("drop the scaler (or ", Call("amp_on", ("bf16",)), ", which uses none)"),
        )
    for name, model in models.items():
        if _half_params(model):
            yield Finding(
                "amp",
                "error",
                name,
                f"{name} was cast to fp16 (.half()) while a GradScaler is active: unscaling "
                "fp16 gradients fails, and fp16 weights lose small updates",
                (
                    f"{name}.float(), and let autocast run the fp16 maths (",
                    Call("amp_on", ("fp16",)),
                    ")",
                ),
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
                    (
                        f"recreate the scheduler over {opt_name}; ",
                        Call("unfreeze", mention=True),
                        " / ",
                        Call("replace_head", mention=True),
                        " keep it in step from then on",
                    ),
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
        v
        for _, value in ws.items()
        for v in leaves(value, depth=1, kind=object)
        if scheduler_sync.is_scheduler(v)
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


# -- 7: graphs kept alive ------------------------------------------------------------


def _graph_tensors(value: object) -> int:
    """Tensors with a grad_fn in a list or dict of tensors (or of lists / dicts of them),
    among its newest entries."""
    found = leaves(value, depth=2, max_items=LEAK_SCAN_ITEMS, newest=True)
    return sum(t.grad_fn is not None for t in found)


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


def _ema_copies(ws: Workspace, models: Mapping[str, nn.Module]) -> Iterator[Finding]:
    """An EMA copy whose structure no longer matches the model it averages (the model
    sharing most of its parameter names): its next update crashes on a shape, or blends a
    fresh head into a trained one."""
    for path, copy in ws.ema_helpers():
        shapes = parameter_shapes(unwrap(copy))
        scored = []
        for name, model in models.items():
            theirs = parameter_shapes(unwrap(model))
            scored.append((len(shapes.keys() & theirs.keys()), name, theirs))
        if not scored:
            continue
        shared, name, theirs = max(scored, key=lambda item: item[0])
        if shared * 2 < len(shapes) or theirs == shapes:
            continue
        names = [*theirs, *(k for k in shapes if k not in theirs)]  # the model's order
        differ = [k for k in names if shapes.get(k) != theirs.get(k)]
        first = differ[0]
        yield Finding(
            "ema-mismatch",
            "error",
            path,
            f"the EMA copy `{path}` no longer matches `{name}`: {first} is "
            f"{_shape(theirs.get(first))} in {name} but {_shape(shapes.get(first))} in the copy "
            f"({len(differ)} parameter(s) differ); its next update fails or averages the wrong "
            "tensors",
            f"re-create it from {name} (e.g. {path} = AveragedModel({name})); "
            "torchmagic's head replacements keep EMA copies in step from then on",
        )


def _shape(shape: tuple[int, ...] | None) -> str:
    return "missing" if shape is None else "×".join(map(str, shape)) or "a scalar"


def _wrappers(ws: Workspace, watch: CompileWatch | None) -> Iterator[Finding]:
    for name, value in ws.items():
        if not isinstance(value, nn.Module):
            continue
        if isinstance(value, nn.DataParallel) and not value.device_ids:  # built without GPUs
            yield Finding(
                "data-parallel",
                "info",
                name,
                "nn.DataParallel without a GPU only wraps the model: it runs the model "
                "itself, with nothing in parallel",
                f"use {name}.module (the model itself); on GPUs, DistributedDataParallel "
                "launched with torchrun",
            )
        elif isinstance(value, nn.DataParallel):
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


# -- 9: data, weights and head that must match ----------------------------------------
# Replacing the last layer is not enough: labels must fit the head, and the inputs must
# look like what the pretrained weights saw (normalisation, resolution).

# Input sides further than this factor from the weights' crop size are reported.
RESOLUTION_FACTOR = 2.0
# Normalize mean / std values closer than this count as the same.
NORM_TOLERANCE = 2e-3


@dataclass(frozen=True)
class _Data:
    """One dataset in the namespace (bound itself, or as a loader's ``.dataset``)."""

    name: str  # the variable: a loader's name when seen through a loader
    dataset: object
    batch: object | None  # a peeked batch (loaders only)


def _data_sources(ws: Workspace) -> list[_Data]:
    loaders = [(n, v) for n, v in ws.items() if isinstance(v, DataLoader)]
    seen = {id(v.dataset) for _, v in loaders}
    found = [_Data(n, v.dataset, datasets.peek(v)) for n, v in loaders]
    found += [
        _Data(n, v, None)
        for n, v in ws.items()
        if isinstance(v, Dataset) and not isinstance(v, IterableDataset) and id(v) not in seen
    ]
    return found


def _head_of(model: nn.Module) -> Head | None:
    try:
        return find_head(model)
    except TorchMagicError:
        return None


def _labels(source: _Data) -> torch.Tensor | None:
    labels = datasets.declared_labels(source.dataset)
    if labels is None and source.batch is not None:
        labels = datasets.batch_parts(source.batch)[1]
    return labels


def _label_range(name: str, head: Head, sources: list[_Data]) -> Iterator[Finding]:
    classes = head.out_features
    for source in sources:
        labels = _labels(source)
        if labels is None:
            continue
        real = labels[labels != datasets.IGNORE_INDEX]
        if not real.numel():
            continue
        low, high = int(real.min()), int(real.max())
        if high < classes and low >= 0:
            continue
        where = f"{name}.{head.name}" if head.name else name
        bad = high if high >= classes else low
        yield Finding(
            "labels",
            "error",
            f"{source.name} → {where}",
            f"{source.name} has label {bad} but {where} has {classes} outputs (labels "
            f"0 to {classes - 1}): cross_entropy fails, on the GPU as 'device-side assert "
            "triggered'",
            (
                Call("replace_head", (f"{name}.{head.name}", high + 1)),
                f" for {high + 1} classes, or map the labels to 0..{classes - 1}",
            )
            if head.name
            else f"map the labels to 0..{classes - 1}",
        )


def _class_count(name: str, head: Head, sources: list[_Data]) -> Iterator[Finding]:
    for source in sources:
        declared = datasets.declared_classes(source.dataset)
        if declared is None or declared == head.out_features:
            continue
        where = f"{name}.{head.name}" if head.name else name
        yield Finding(
            "classes",
            "warning",
            f"{source.name} → {where}",
            f"{source.name} declares {declared} classes but {where} has "
            f"{head.out_features} outputs",
            (Call("replace_head", (where, declared)),),
        )


def _weights_categories(
    name: str, head: Head, weights: WeightsInfo, replaced: bool
) -> Iterator[Finding]:
    """A head that is not the weights' own, changed outside the session: the weights'
    ``categories`` no longer name its outputs."""
    if replaced or weights.num_categories in (None, head.out_features):
        return
    where = f"{name}.{head.name}" if head.name else name
    yield Finding(
        "classes",
        "info",
        where,
        f"{where} has {head.out_features} outputs but {weights.name} has "
        f"{weights.num_categories} categories: weights.meta['categories'] does not name "
        "its predictions",
        "decode predictions with your dataset's class names, not the weights' categories",
    )


def _same(values: tuple[float, ...], expected: tuple[float, ...]) -> bool:
    if len(values) == 1:
        values = values * len(expected)
    return len(values) == len(expected) and all(
        abs(a - b) <= NORM_TOLERANCE for a, b in zip(values, expected, strict=True)
    )


def _short(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"


def _normalisation(name: str, weights: WeightsInfo, sources: list[_Data]) -> Iterator[Finding]:
    if weights.mean is None or weights.std is None:
        return
    for source in sources:
        for norm in datasets.normalizations(source.dataset):
            if _same(norm.mean, weights.mean) and _same(norm.std, weights.std):
                continue
            yield Finding(
                "normalization",
                "warning",
                f"{source.name} → {name}",
                f"{source.name} normalises with mean {_short(norm.mean)} std "
                f"{_short(norm.std)}; {name}'s weights {weights.name} expect mean "
                f"{_short(weights.mean)} std {_short(weights.std)}: every input is "
                "shifted from what the pretrained features saw",
                f"Normalize(mean={list(weights.mean)}, std={list(weights.std)}), or use the "
                "weights' own transforms (weights.transforms())",
            )


def _resolution(name: str, weights: WeightsInfo, sources: list[_Data]) -> Iterator[Finding]:
    crop = weights.crop_size
    if not crop:
        return
    for source in sources:
        inputs = datasets.batch_parts(source.batch)[0] if source.batch is not None else None
        size = datasets.image_size(inputs)
        if size is None:
            continue
        if crop / RESOLUTION_FACTOR <= min(size) and max(size) <= crop * RESOLUTION_FACTOR:
            continue
        yield Finding(
            "resolution",
            "warning",
            f"{source.name} → {name}",
            f"{source.name} gives {size[0]}×{size[1]} images; {name}'s weights "
            f"{weights.name} were trained on {crop}×{crop} crops: the pretrained "
            "features fit that scale (fixed-size models such as ViT fail outright)",
            f"resize to about {crop} in the dataset's transforms (the weights' "
            "transforms() resize and crop as trained)",
        )


def _known_weights(
    ws: Workspace, models: Mapping[str, nn.Module], recorded: Mapping[str, object]
) -> dict[str, WeightsInfo]:
    """Model name → what its pretrained weights expect: recorded by ``load_model``, else
    a torchvision ``WeightsEnum`` member bound in the namespace, applied to the only model
    or to the models whose class the enum is named after (``ResNet`` / ``ResNet18_Weights``)."""
    known = {n: info for n, w in recorded.items() if (info := expected_inputs(w)) is not None}
    bound = [v for _, v in ws.items() if is_weights(v)]
    for value in dict.fromkeys(bound):
        info = describe(value)
        enum_name = type(value).__name__.lower()
        for name, model in models.items():
            if name in known:
                continue
            if len(models) == 1 or enum_name.startswith(type(unwrap(model)).__name__.lower()):
                known[name] = info
    return known


def _data_and_weights(
    ws: Workspace,
    models: Mapping[str, nn.Module],
    trained: Mapping[str, nn.Module],
    weights: Mapping[str, object],
    replaced_heads: Container[str],
) -> Iterator[Finding]:
    """Labels, class counts, normalisation and resolution of the data in the namespace
    against the trained models (the only model, when none is trained yet)."""
    checked = trained or (models if len(models) == 1 else {})
    known = _known_weights(ws, models, weights)
    sources = _data_sources(ws) if checked else []
    for name, value in checked.items():
        model = unwrap(value)
        head = _head_of(model)
        if head is not None:
            yield from _label_range(name, head, sources)
            yield from _class_count(name, head, sources)
        info = known.get(name)
        if info is None:
            continue
        if head is not None:
            yield from _weights_categories(name, head, info, name in replaced_heads)
        yield from _normalisation(name, info, sources)
        yield from _resolution(name, info, sources)


# -- 10: the loader sets the pace ------------------------------------------------------

# A run that waited for batches longer than this share of its wall time is reported.
DATA_WAIT_SHARE = 0.3


def _data_wait(ws: Workspace, fits: Sequence[object], pin: object | None) -> Iterator[Finding]:
    """The last run's share of wall time spent waiting for the loader (``data_wait_s`` /
    ``wall_s`` of its history), with the usual remedies in the order they pay."""
    if not fits:
        return
    last = fits[-1]
    wait, wall = getattr(last, "data_wait_s", None), getattr(last, "wall_s", None)
    if not isinstance(wait, (int, float)) or not isinstance(wall, (int, float)) or wall <= 0:
        return
    share = wait / wall
    if share <= DATA_WAIT_SHARE:
        return
    single = [n for n, v in ws.items() if isinstance(v, DataLoader) and v.num_workers == 0]
    workers = min(8, os.cpu_count() or 1)
    remedies = [
        f"num_workers={workers} (loading in {workers} processes"
        + (f"; {_names(single)} load(s) in the main process now)" if single else ")")
    ]
    if getattr(pin, "ran", False):
        if getattr(pin, "recommend", False):
            remedies.append(
                f"pin_memory=True with .to(device, non_blocking=True) (pinbench measured "
                f"{getattr(pin, 'speedup', 0.0):.1f}x faster copies)"
            )
    else:
        remedies.append(
            "pin_memory=True with .to(device, non_blocking=True) on a GPU (pinbench measures it)"
        )
    remedies += [
        "persistent_workers=True (workers survive from one epoch to the next)",
        "lighter per-sample transforms (resize once ahead of time, cache decoded images)",
    ]
    label = getattr(last, "label", "the last run")
    yield Finding(
        "data-wait",
        "warning",
        label,
        f"{label} spent {share:.0%} of its wall time waiting for batches: the loader, not "
        "the model, sets the pace",
        "DataLoader(..., " + "; then ".join(f"{i}) {r}" for i, r in enumerate(remedies, 1)),
    )


# -- the scan ------------------------------------------------------------------------


def diagnose(
    namespace: MutableMapping,
    *,
    hidden: Container[str] = (),
    amp: AmpState | None = None,
    scaler: torch.amp.GradScaler | None = None,
    compile_watch: CompileWatch | None = None,
    device: torch.device | None = None,
    weights: Mapping[str, object] | None = None,
    replaced_heads: Container[str] = (),
    fits: Sequence[object] = (),
    pinbench: object | None = None,
) -> DoctorReport:
    """Run every check over the namespace and the session's state: its AMP policy and
    scaler, its device (models being trained elsewhere are named) and its
    :class:`CompileWatch` (without one, compiled models cannot be compared to what they
    were; it observes this namespace afterwards).

    ``weights``: model name → the weights ``load_model`` built it with (a ``WeightsEnum``
    member, a ``WeightsInfo`` or a ``LoadedModel``); ``replaced_heads``: models whose head
    the session replaced; ``fits``: the session's runs (the last one's data wait is
    judged); ``pinbench``: the last pinbench report, quoted in the remedies."""
    ws = Workspace(namespace, hidden)  # read only: nothing is resolved or remembered
    models = ws.models()
    optimizers = ws.optimizers()
    found_scalers = [scaler, getattr(amp, "scaler", None), *ws.scalers()]
    scalers = list({id(s): s for s in found_scalers if s is not None and s.is_enabled()}.values())
    findings: list[Finding] = []
    trained: dict[str, nn.Module] = {}
    orphans = _orphans(ws, optimizers)
    findings += _stale_optimizers(models, optimizers, orphans)
    for name, value in models.items():
        model = unwrap(value)
        opts = owners(optimizers, model.parameters())
        if opts:
            trained[name] = model
            findings += _unoptimized(name, model, opts, orphans)
            findings += _frozen_in_optimizer(name, model, opts)
            findings += _state_shapes(name, model, opts)
            if device is not None:
                findings += _off_session_device(name, model, device)
        findings += _bn_drift(name, model)
        findings += _devices(name, model, opts, scalers)
    findings += _amp(amp, trained, scalers)
    findings += _data_and_weights(ws, models, trained, weights or {}, replaced_heads)
    findings += _data_wait(ws, fits, pinbench)
    findings += _schedulers(ws, optimizers)
    findings += _leaks(ws)
    findings += _wrappers(ws, compile_watch)
    findings += _ema_copies(ws, models)
    if compile_watch is not None:
        compile_watch.observe(namespace, hidden)
    scanned = [f"{n} ({type(unwrap(m)).__name__})" for n, m in models.items()]
    scanned += [f"{n} ({type(o).__name__})" for n, o in optimizers]
    scanned += [f"GradScaler ({s._device})" for s in scalers]
    if amp is not None:
        scanned.append("AMP " + ("on" if amp.enabled else "off"))
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return DoctorReport(tuple(findings), tuple(scanned))
