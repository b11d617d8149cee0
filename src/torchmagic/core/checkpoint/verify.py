"""The checks of a resume: before the replay (nothing changed yet) and after it (the
replayed structure is exactly the file's, by name)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..errors import TorchMagicError
from ..modules import parameter_names
from ..surgery import scheduler_sync
from ..surgery.edits import BoundModel
from ..training.amp import choose_dtype
from . import integrity
from .records import (
    bn_policies,
    class_name,
    head_layer,
    label_maps,
    optimizer_class,
    short_name,
)


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
            f"the file holds a {short_name(opt['class'])} state and no optimizer "
            f"holds the parameters of '{name}'",
        )
    if opt is not None and optimizer_class(target.optimizer) != opt["class"]:
        raise _refuse(
            path,
            f"the optimizer is a {optimizer_class(target.optimizer)}, the file's is {opt['class']}",
        )
    live = [class_name(s) for s in scheduler_sync.roots(target.schedulers)]
    saved_schedulers = [s["class"] for s in payload["schedulers"]]
    if live != saved_schedulers:
        raise _refuse(
            path,
            f"the schedulers are [{', '.join(map(short_name, live))}], the file's are "
            f"[{', '.join(map(short_name, saved_schedulers))}]",
        )
    replaced = [h["path"] for h in saved["heads"]] + [a["path"] for a in saved["adapters"]]
    layers = {}
    for head in saved["heads"]:
        try:
            layers[head["path"]] = head_layer(model.get_submodule(head["path"]))
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
    policies = bn_policies(model)
    for key, policy in saved["batchnorm"].items():
        if policies.get(key) != policy:
            raise _refuse(
                path, f"after replaying, BatchNorm '{key}' is {policies.get(key)}, not {policy}"
            )
    labels = label_maps(model)
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
    mismatch = integrity.state_shape_mismatch(
        target.optimizer, opt["state"], dict(model.named_parameters())
    )
    if mismatch is not None:
        raise _refuse(path, mismatch)
