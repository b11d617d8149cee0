"""A session's training state in one file that a fresh process continues from, bit for bit.

Everything is keyed by name, never by position: the model's ``state_dict``, the optimizer
state by parameter name, each param group's hyper-parameters and members by name, every
scheduler's state, the GradScaler's, the AMP policy and the random generators. The
structure the session made (frozen blocks, new heads, groups and their base lrs, BatchNorm
policies, label maps) is kept as the commands that made it (:class:`Replay`): the Session
replays them through its own edits on a model built the original way, so flags, groups,
home groups and every scheduler's per-group lists are the engine's own; then this module
checks the result against the file and loads the states.

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

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import torch_files
from .advice import Command, spelled
from .errors import TorchMagicError
from .integrations import peft
from .modules import is_batchnorm, parameter_names
from .rng import capture_rng, restore_rng
from .surgery import batchnorm, scheduler_sync
from .surgery.edits import BoundModel
from .surgery.results import HistoryEntry, Replay
from .tensors import step_stays_on_host
from .training.amp import AmpController, choose_dtype

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


def class_name(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _short(qualified: str) -> str:
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


def _head_layer(module: nn.Module) -> nn.Module:
    """The layer of a head (a new head with dropout is ``Sequential(Dropout, layer)``)."""
    if isinstance(module, nn.Sequential) and len(module):
        return module[-1]
    return module


def _head_record(model: nn.Module, path: str, replay: Replay | None) -> dict:
    layer = _head_layer(model.get_submodule(path))
    options = replay.kwargs() if replay is not None else {}
    return {
        "path": path,
        "class": class_name(layer),
        "in_features": getattr(layer, "in_features", getattr(layer, "in_channels", None)),
        "out_features": getattr(layer, "out_features", getattr(layer, "out_channels", None)),
        "bias": getattr(layer, "bias", None) is not None,
        "dropout": options.get("dropout"),
    }


def _label_maps(model: nn.Module) -> dict:
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


def _bn_policies(model: nn.Module) -> dict[str, str]:
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
) -> dict:
    """Everything a fresh process needs to continue: see the module docstring."""
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
        "model": {
            "name": target.model_name,
            "class": class_name(model),
            "state_dict": dict(model.state_dict()),
            "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
            "batchnorm": _bn_policies(model),
            "heads": list(heads.values()),
            "labels": _label_maps(model),
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
            for p, s in opt.state.items()
            if id(p) in names and s
        }
        payload["optimizer"] = {
            "name": target.optimizer_name,
            "class": class_name(opt),
            "groups": groups,
            "state": state,
        }
    for s in scheduler_sync.roots(target.schedulers):
        payload["schedulers"].append(
            {"class": class_name(s), "state": plain(s.state_dict(), type(s).__name__)}  # type: ignore[attr-defined]
        )
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
        model_class=_short(payload["model"]["class"]),
        optimizer_name=None if opt is None else opt["name"],
        commands=tuple(
            (c["command"] for c in payload["history"]) if commands is None else commands
        ),
        groups=0 if opt is None else len(opt["groups"]),
        schedulers=tuple(_short(s["class"]) for s in payload["schedulers"]),
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
    )


# -- writing and reading -------------------------------------------------------------


def write(payload: dict, path: str | os.PathLike, *, sync: bool = False) -> int:
    """``torch.save`` into a temporary file beside ``path``, then renamed over it: ``path``
    is the old file or the whole new one, never a part (Ctrl-C, a full disk, a killed
    process). ``sync``: ``fsync`` the file and its folder first, so the new file also
    survives a power loss (on a local disk that doubles the time of a large save).
    Returns the size."""
    path = os.path.expanduser(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TorchMagicError(f"cannot save to '{path}': no folder '{folder}'", param="path")
    try:
        fd, temporary = tempfile.mkstemp(prefix=".tm-save-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise TorchMagicError(f"cannot save to '{path}': {exc.strerror}", param="path") from None
    os.close(fd)
    try:
        torch.save(payload, temporary)  # by name: torch's own file writer, no Python stream
        if sync:
            _fsync(temporary, os.O_RDONLY)
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        reason = _write_failure(exc, folder)
        if reason is None:
            raise
        kept = "the old file is kept" if os.path.exists(path) else "nothing was written"
        raise TorchMagicError(f"cannot save to '{path}': {reason}; {kept}") from None
    if sync:
        with contextlib.suppress(OSError):  # the rename itself, on file systems that allow it
            _fsync(folder, os.O_RDONLY)
    return os.path.getsize(path)


def _write_failure(exc: BaseException, folder: str) -> str | None:
    """Why the file system refused the write (a full disk, a quota, permissions), in
    words; None for anything else (Ctrl-C goes on as itself). torch's own writer raises a
    RuntimeError without the OS's reason: the space left on that disk says it."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, RuntimeError) and "file write failed" in str(exc):
        free = shutil.disk_usage(folder).free
        return f"the write failed with {free / (1 << 20):.1f} MiB free on that disk"
    return None


def _fsync(path: str, flags: int) -> None:
    handle = os.open(path, flags)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def read(path: str | os.PathLike) -> dict:
    """The checkpoint at ``path``, loaded with ``weights_only=True`` onto the CPU and
    memory-mapped (weights are copied once, into the model; see :func:`_owned`); a file
    that is missing, truncated, not torch's or not ours is refused in one line."""
    path = os.path.expanduser(os.fspath(path))
    where = f"cannot resume from '{path}'"
    missing = torch_files.not_a_file(path)
    if missing is not None:
        raise TorchMagicError(f"{where}: {missing}", param="path")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001  # any file: torch raises many kinds
        raise TorchMagicError(f"{where}: {torch_files.load_refusal(exc)}", param="path") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise TorchMagicError(
            f"{where}: not a torchmagic checkpoint (written by Session.save)", param="path"
        )
    if payload.get("version") != VERSION:
        raise TorchMagicError(
            f"{where}: checkpoint format version {payload.get('version')} (this torchmagic "
            f"reads version {VERSION})",
            param="path",
        )
    return payload


# -- checking ------------------------------------------------------------------------


def _refuse(path: str, reason: str) -> TorchMagicError:
    return TorchMagicError(f"cannot resume from '{path}': {reason}; nothing was changed")


def _under(key: str, paths: Sequence[str]) -> bool:
    return any(key.startswith(f"{p}.") for p in paths)


def _shapes(state: Mapping[str, object], skip: Sequence[str] = ()) -> dict[str, tuple]:
    return {
        k: tuple(v.shape)
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
        and not k.endswith("num_batches_tracked")
        and not _under(k, skip)
    }


def _first_difference(saved: Mapping[str, tuple], live: Mapping[str, tuple], model: str) -> str:
    """The first key missing on either side or of another shape, in the file's order."""
    for key, shape in saved.items():
        if key not in live:
            return f"'{model}' has no '{key}' (the file's {list(shape)})"
        if live[key] != shape:
            return f"'{key}' is {list(live[key])} in '{model}', {list(shape)} in the file"
    for key in live:
        if key not in saved:
            return f"'{model}' has '{key}', which the file does not"
    return ""


def check_fresh(
    payload: dict, path: str, target: BoundModel, device_type: str, already: int
) -> None:
    """What can be checked before anything changes: the classes, the schedulers, the heads
    the commands replace, and every weight outside them by name and shape."""
    model, saved = target.model, payload["model"]
    name = target.model_name
    if already:
        raise _refuse(
            path,
            f"the session already changed '{name}' ({already} command(s)); resume into a "
            "model built the way the notebook first built it",
        )
    if class_name(model) != saved["class"]:
        raise _refuse(path, f"'{name}' is a {class_name(model)}, the file holds a {saved['class']}")
    opt = payload["optimizer"]
    if opt is not None and target.optimizer is None:
        raise _refuse(
            path,
            f"the file holds a {_short(opt['class'])} state and no optimizer "
            f"holds the parameters of '{name}'",
        )
    if opt is not None and class_name(target.optimizer) != opt["class"]:
        raise _refuse(
            path,
            f"the optimizer is a {class_name(target.optimizer)}, the file's is {opt['class']}",
        )
    live = [class_name(s) for s in scheduler_sync.roots(target.schedulers)]
    saved_schedulers = [s["class"] for s in payload["schedulers"]]
    if live != saved_schedulers:
        raise _refuse(
            path,
            f"the schedulers are [{', '.join(map(_short, live))}], the file's are "
            f"[{', '.join(map(_short, saved_schedulers))}]",
        )
    replaced = [h["path"] for h in saved["heads"]] + [a["path"] for a in saved["adapters"]]
    layers = {}
    for head in saved["heads"]:
        try:
            layers[head["path"]] = _head_layer(model.get_submodule(head["path"]))
        except AttributeError:
            raise _refuse(
                path,
                f"the file replaced the head at '{head['path']}', and '{name}' has no "
                f"module '{head['path']}'",
            ) from None
    difference = _first_difference(
        _shapes(saved["state_dict"], replaced), _shapes(model.state_dict(), replaced), name
    )
    if difference:
        raise _refuse(path, f"another architecture: {difference}")
    for head in saved["heads"]:
        layer = layers[head["path"]]
        features = getattr(layer, "in_features", getattr(layer, "in_channels", None))
        if features != head["in_features"]:
            raise _refuse(
                path,
                f"the head at '{head['path']}' takes {features} features in '{name}', "
                f"{head['in_features']} in the file",
            )
    amp = payload["amp"]
    if amp["enabled"]:
        try:
            choose_dtype(device_type, amp["dtype"])
        except TorchMagicError as exc:
            raise _refuse(
                path, f"its AMP policy ({amp['dtype']}) does not apply here: {exc}"
            ) from None


def check_replayed(payload: dict, path: str, target: BoundModel) -> None:
    """After the replay: the model, its flags, BatchNorm policies, label maps and param
    groups are exactly the file's, by name."""
    model, saved, name = target.model, payload["model"], target.model_name
    difference = _first_difference(_shapes(saved["state_dict"]), _shapes(model.state_dict()), name)
    if difference:
        raise _refuse(path, f"after replaying the commands, {difference}")
    for key, flag in saved["requires_grad"].items():
        live = model.get_parameter(key).requires_grad
        if live != flag:
            state = "trains" if live else "is frozen"
            raise _refuse(
                path, f"after replaying the commands, '{key}' {state}, unlike in the file"
            )
    policies = _bn_policies(model)
    for key, policy in saved["batchnorm"].items():
        if policies.get(key) != policy:
            raise _refuse(
                path, f"after replaying, BatchNorm '{key}' is {policies.get(key)}, not {policy}"
            )
    labels = _label_maps(model)
    for key, value in saved["labels"].items():
        if labels.get(key) != value:
            raise _refuse(path, f"after replaying, the model's {key} is not the file's")
    opt = payload["optimizer"]
    if opt is None or target.optimizer is None:
        return
    names = parameter_names(model)
    live_groups = target.optimizer.param_groups
    if len(live_groups) != len(opt["groups"]):
        raise _refuse(
            path,
            f"after replaying, the optimizer has {len(live_groups)} param groups, the file "
            f"{len(opt['groups'])}",
        )
    for i, (group, saved_group) in enumerate(zip(live_groups, opt["groups"], strict=True)):
        members = [names.get(id(p), "?") for p in group["params"]]
        if members != saved_group["params"]:
            odd = next(
                (
                    m
                    for m in [*members, *saved_group["params"]]
                    if (m in members) != (m in saved_group["params"])
                ),
                "their order",
            )
            raise _refuse(path, f"after replaying, param group {i} differs from the file's ({odd})")


# -- loading -------------------------------------------------------------------------


def _owned(value: Any) -> Any:
    """``value`` with every tensor copied: the file is read memory-mapped, and nothing may
    keep pointing into it (a later write over that file would pull the pages away)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_owned(v) for v in value)
    return value


def _placed(value: object, param: nn.Parameter, group: dict, key: str) -> object:
    """A state value where the optimizer keeps it (with its parameter, except a host
    ``step``), in memory of its own."""
    if not isinstance(value, torch.Tensor):
        return value
    moved = value if step_stays_on_host(group, key) else value.to(param.device)
    return moved.clone() if moved is value else moved


def load_states(payload: dict, target: BoundModel) -> None:
    """Weights, group hyper-parameters (in place: groups keep their identity), optimizer
    state by name and scheduler states. Call after :func:`check_replayed`."""
    model, opt = target.model, target.optimizer
    model.load_state_dict(payload["model"]["state_dict"], strict=True)
    saved = payload["optimizer"]
    if opt is not None and saved is not None:
        names = parameter_names(model)
        for group, saved_group in zip(opt.param_groups, saved["groups"], strict=True):
            group.update(_owned(saved_group["hyperparameters"]))
            for p in group["params"]:
                state = saved["state"].get(names[id(p)])
                if state is None:
                    opt.state.pop(p, None)
                else:
                    opt.state[p] = {k: _placed(v, p, group, k) for k, v in state.items()}
    for scheduler, state in zip(
        scheduler_sync.roots(target.schedulers), payload["schedulers"], strict=True
    ):
        scheduler.load_state_dict(_owned(state["state"]))  # type: ignore[attr-defined]


def load_precision(
    payload: dict, amp: AmpController, device_type: str, scaler: torch.amp.GradScaler | None
) -> None:
    """The AMP policy on ``device_type`` and the GradScaler's state (into ``scaler`` when
    the caller has its own)."""
    policy = payload["amp"]
    if policy["enabled"]:
        amp.turn_on(device_type, policy["dtype"])
    if scaler is not None:
        amp.scaler = scaler
    if payload["scaler"] is not None and amp.scaler is not None:
        amp.scaler.load_state_dict(_owned(payload["scaler"]))


def load_rng(payload: dict) -> None:
    restore_rng(payload["rng"])


def replays(payload: dict) -> Iterator[tuple[str, Replay]]:
    """The file's commands as (command, replay), refusing methods this version lacks."""
    for entry in payload["history"]:
        r = entry["replay"]
        if r["method"] not in REPLAYABLE:
            raise TorchMagicError(
                f"cannot resume: {entry['command']} needs Session.{r['method']}, which this "
                "torchmagic cannot replay; nothing was changed"
            )
        yield (
            entry["command"],
            Replay(r["method"], tuple(r["targets"]), tuple(r["options"].items())),
        )
