"""A session's training state in one file that a fresh process continues from, bit for bit.

Everything is keyed by name, never by position: the model's ``state_dict``, the optimizer
state by parameter name, each param group's hyper-parameters and members by name, every
scheduler's state, the GradScaler's, the AMP policy and the random generators. The
structure the session made (frozen blocks, new heads, groups and their base lrs, BatchNorm
policies, label maps) is kept as the commands that made it (:class:`Replay`): the Session
replays them through its own edits on a model built the original way, so flags, groups,
home groups and every scheduler's per-group lists are the engine's own; then this module
checks the result against the file and loads the states.

It also records where it was written (:mod:`.provenance`): Python, torch, torchvision
and the timm / transformers / peft versions the model's classes come from, and the zoo
call that built the model, where ``load_model`` did.

The file holds plain containers of tensors, numbers and strings, so
``torch.load(path, weights_only=True)`` reads it; it is written to a temporary file in the
same folder and renamed, so an interrupted save never leaves a truncated file.

A new kind of structural change is one more :class:`Replay` method in the history. LoRA
adapters are replayed so (``lora``, ``merge_lora``, ``lora_off`` / ``lora_on``), and the
layers adapted when the file was written are named under ``model["adapters"]`` (path and
rank): their state keys differ from a fresh model's (``x.base_layer.weight``,
``x.lora_A.default.weight``), so the check before the replay leaves them to the check after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..advice import Command, spelled
from ..errors import TorchMagicError
from ..integrations import peft
from ..integrations.lookup import state_holder, state_of
from ..modules import is_batchnorm, parameter_names
from ..rng import capture_rng
from ..surgery import batchnorm, scheduler_sync
from ..surgery.edits import BoundModel
from ..surgery.results import HistoryEntry, Replay
from ..training.amp import AmpController
from . import integrity, provenance

FORMAT = "torchmagic.checkpoint"
VERSION = 1
REPLAYABLE = (
    "freeze",
    "unfreeze",
    "replace_head",
    "set_base_lrs",
    "lora",
    "merge_lora",
    "lora_off",
    "lora_on",
)


@dataclass(frozen=True)
class SaveReport:
    """What a save wrote."""

    path: str
    nbytes: int
    model_name: str
    model_class: str
    optimizer_name: str | None
    commands: tuple[Command, ...]  # as the history holds them: each front end spells them
    groups: int
    schedulers: tuple[str, ...]
    amp: str | None  # "bf16", "fp16", or None (off)
    synced: bool = False  # fsync'd: on the disk, not only in the page cache


@dataclass(frozen=True)
class ResumeReport:
    """What a resume replayed and loaded."""

    path: str
    model_name: str
    model_class: str
    optimizer_name: str | None
    commands: tuple[str, ...]
    groups: int
    schedulers: tuple[str, ...]
    amp: str | None
    saved_with: str  # the torchmagic version that wrote the file
    warnings: tuple[str, ...] = ()  # one line each: another torch minor version


def class_name(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def optimizer_class(opt: object) -> str:
    """The optimizer's class as a resume must match it: with the class of the base
    optimizer that one stepping another keeps its state in (``torch.optim.adamw.AdamW in
    timm.optim.lookahead.Lookahead``), whose moments the file holds."""
    base = state_holder(opt)
    return class_name(opt) if base is opt else f"{class_name(base)} in {class_name(opt)}"


def short_name(qualified: str) -> str:
    return qualified.rpartition(".")[2]


# -- plain values --------------------------------------------------------------------

_SCALARS = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device)
_DROP = object()  # a callable: rebuilt by the user's own construction, never stored


def plain(value: object, where: str) -> Any:
    """``value`` as plain containers (what ``weights_only`` loads): callables left out (a
    dict's entry dropped, a list's item None); anything else is refused, naming ``where``."""
    if isinstance(value, _SCALARS) or isinstance(value, torch.Tensor):
        return value
    if callable(value):
        return _DROP
    if isinstance(value, (list, tuple)):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        items = [None if v is _DROP else v for v in items]  # positions kept (one per group)
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TorchMagicError(f"cannot save {where}: a key of type {type(key).__name__}")
            kept = plain(item, f"{where}[{key!r}]")
            if kept is not _DROP:
                out[key] = kept
        return out
    raise TorchMagicError(
        f"cannot save {where}: a {type(value).__name__} is not a tensor, number or string"
    )


# -- what the file holds -------------------------------------------------------------


def head_layer(module: nn.Module) -> nn.Module:
    """The layer of a head (a new head with dropout is ``Sequential(Dropout, layer)``)."""
    if isinstance(module, nn.Sequential) and len(module):
        return module[-1]
    return module


def _head_record(model: nn.Module, path: str, replay: Replay | None) -> dict:
    layer = head_layer(model.get_submodule(path))
    options = replay.kwargs() if replay is not None else {}
    return {
        "path": path,
        "class": class_name(layer),
        "in_features": getattr(layer, "in_features", getattr(layer, "in_channels", None)),
        "out_features": getattr(layer, "out_features", getattr(layer, "out_channels", None)),
        "bias": getattr(layer, "bias", None) is not None,
        "dropout": options.get("dropout"),
    }


def label_maps(model: nn.Module) -> dict:
    """``num_classes`` / ``num_labels`` and a Hugging Face ``id2label``, where the model has
    them."""
    out: dict = {}
    for attr in ("num_classes", "num_labels"):
        value = vars(model).get(attr)
        if isinstance(value, int) and not isinstance(value, bool):
            out[attr] = value
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if isinstance(id2label, dict):
        out["num_labels"] = len(id2label)
        out["id2label"] = {int(k): str(v) for k, v in id2label.items()}
    return out


def bn_policies(model: nn.Module) -> dict[str, str]:
    """Each BatchNorm layer's policy: ``held`` (eval by policy), ``frozen`` (swapped) or
    ``free`` (follows ``train()`` / ``eval()``)."""
    out = {}
    for name, module in model.named_modules():
        if is_batchnorm(module):
            kind = batchnorm.mode(module)
            out[name] = kind if kind in ("held", "frozen") else "free"
    return out


def _command(entry: HistoryEntry, spell: Callable[[Replay], str]) -> dict:
    if entry.replay is None or entry.replay.method not in REPLAYABLE:
        raise TorchMagicError(
            f"cannot save: {spelled(entry.command)} cannot be replayed from a file"
        )
    replay = entry.replay
    return {
        "command": spelled(entry.command),
        "action": entry.action,
        "python": spell(replay),
        "replay": {
            "method": replay.method,
            "targets": list(replay.targets),
            "options": plain(dict(replay.options), f"the options of {spelled(entry.command)}"),
        },
    }


def capture(
    target: BoundModel,
    commands: Sequence[HistoryEntry],
    amp: AmpController,
    spell: Callable[[Replay], str],
    version: str,
    built_by: dict | None = None,
) -> dict:
    """Everything a fresh process needs to continue: see the module docstring.
    ``built_by``: the zoo call that built the model (:func:`provenance.zoo_call`)."""
    model, opt = target.model, target.optimizer
    names = parameter_names(model)
    heads: dict[str, dict] = {}
    for entry in commands:
        if entry.action == "replace_head":
            for path in entry.modules:
                heads[path] = _head_record(model, path, entry.replay)
    payload: dict = {
        "format": FORMAT,
        "version": VERSION,
        "torchmagic": version,
        "torch": str(torch.__version__),
        "environment": provenance.environment(model),
        "model": {
            "name": target.model_name,
            "class": class_name(model),
            "zoo": built_by,
            "state_dict": dict(model.state_dict()),
            "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
            "batchnorm": bn_policies(model),
            "heads": list(heads.values()),
            "labels": label_maps(model),
            "adapters": [{"path": n, "rank": peft.rank(m)} for n, m in peft.lora_layers(model)],
        },
        "optimizer": None,
        "schedulers": [],
        "amp": {
            "enabled": amp.enabled,
            "dtype": amp.status().dtype,
            "device_type": amp.device_type,
        },
        "scaler": amp.scaler.state_dict() if amp.scaler is not None else None,
        "rng": capture_rng(),
        "history": [_command(e, spell) for e in commands],
    }
    if opt is not None:
        groups = []
        for i, group in enumerate(opt.param_groups):
            foreign = [p for p in group["params"] if id(p) not in names]
            if foreign:
                raise TorchMagicError(
                    f"cannot save: param group {i} of '{target.optimizer_name}' holds "
                    f"{len(foreign)} tensors that are not parameters of '{target.model_name}'"
                )
            hyper = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            groups.append(
                {
                    "params": [names[id(p)] for p in group["params"]],
                    "hyperparameters": plain(hyper, f"param group {i}"),
                }
            )
        state = {
            names[id(p)]: plain(dict(s), f"the optimizer state of {names[id(p)]}")
            for p, s in state_of(opt).items()
            if id(p) in names and s
        }
        payload["optimizer"] = {
            "name": target.optimizer_name,
            "class": optimizer_class(opt),
            "groups": groups,
            "state": state,
        }
    for s in scheduler_sync.roots(target.schedulers):
        payload["schedulers"].append(
            {"class": class_name(s), "state": plain(s.state_dict(), type(s).__name__)}  # type: ignore[attr-defined]
        )
    integrity.write_digests(payload)
    return payload


def summarize_save(
    payload: dict,
    path: str,
    nbytes: int,
    *,
    synced: bool = False,
    commands: Sequence[Command] | None = None,
) -> SaveReport:
    """``commands``: the history's own commands, where the caller has them (else the
    file's, in Python spelling)."""
    opt = payload["optimizer"]
    return SaveReport(
        path=path,
        nbytes=nbytes,
        model_name=payload["model"]["name"],
        model_class=short_name(payload["model"]["class"]),
        optimizer_name=None if opt is None else opt["name"],
        commands=tuple(
            (c["command"] for c in payload["history"]) if commands is None else commands
        ),
        groups=0 if opt is None else len(opt["groups"]),
        schedulers=tuple(short_name(s["class"]) for s in payload["schedulers"]),
        amp=payload["amp"]["dtype"] if payload["amp"]["enabled"] else None,
        synced=synced,
    )


def summarize_resume(payload: dict, path: str, target: BoundModel) -> ResumeReport:
    saved = summarize_save(payload, path, 0)
    return ResumeReport(
        path=path,
        model_name=target.model_name,
        model_class=saved.model_class,
        optimizer_name=target.optimizer_name,
        commands=tuple(spelled(c) for c in saved.commands),
        groups=saved.groups,
        schedulers=saved.schedulers,
        amp=saved.amp,
        saved_with=str(payload.get("torchmagic", "?")),
        warnings=tuple(w for w in (provenance.torch_mismatch(payload),) if w is not None),
    )
