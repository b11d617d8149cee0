"""Loading a checked checkpoint's states into the replayed model, and the file's
commands as replays."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import TorchMagicError
from ..integrations.lookup import state_of
from ..modules import parameter_names
from ..rng import capture_rng, restore_rng
from ..surgery import scheduler_sync
from ..surgery.edits import BoundModel
from ..surgery.results import Replay
from ..tensors import step_stays_on_host
from ..training.amp import AmpController
from .records import REPLAYABLE
from .weights_backup import back_up_weights


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
    """A state value where and as ``Optimizer.load_state_dict`` puts it, in memory of its
    own: with its parameter (except a host ``step``) and, but for ``step``, in a floating
    parameter's dtype (a float32 ``exp_avg`` into a float64 or bf16 model)."""
    if not isinstance(value, torch.Tensor):
        return value
    if step_stays_on_host(group, key):
        moved = value
    elif key != "step" and param.is_floating_point():
        moved = value.to(device=param.device, dtype=param.dtype)
    else:
        moved = value.to(param.device)
    return moved.clone() if moved is value else moved


def load_states(payload: dict, target: BoundModel) -> None:
    """Weights, group hyper-parameters (in place: groups keep their identity), optimizer
    state by name and scheduler states. Call after :func:`check_replayed`."""
    model, opt = target.model, target.optimizer
    model.load_state_dict(payload["model"]["state_dict"], strict=True)
    saved = payload["optimizer"]
    if opt is not None and saved is not None:
        names = parameter_names(model)
        live = state_of(opt)
        for group, saved_group in zip(opt.param_groups, saved["groups"], strict=True):
            group.update(_owned(saved_group["hyperparameters"]))
            for p in group["params"]:
                state = saved["state"].get(names[id(p)])
                if state is None:
                    live.pop(p, None)
                else:
                    live[p] = {k: _placed(v, p, group, k) for k, v in state.items()}
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


def _nothing() -> None:
    """The put-back of what was not changed yet."""


def keep_states(
    target: BoundModel, amp: AmpController, scaler: torch.amp.GradScaler | None
) -> Callable[[], None]:
    """What the loads replace, kept: the returned call puts it all back (the weights'
    memory, see :func:`.weights_backup.back_up_weights`; the optimizer's state and groups,
    schedulers, AMP and its GradScaler, the random generators), so a load that fails half
    way leaves the state before it. The weights are backed up last: nothing before
    changes anything."""
    model, opt = target.model, target.optimizer
    state = None if opt is None else dict(state_of(opt))
    groups = [] if opt is None else [dict(g) for g in opt.param_groups]
    roots = scheduler_sync.roots(target.schedulers)
    schedulers = [copy.deepcopy(s.state_dict()) for s in roots]  # type: ignore[attr-defined]
    precision = dict(vars(amp))
    scalers = [s for s in {id(s): s for s in (amp.scaler, scaler) if s is not None}.values()]
    scaler_states = [copy.deepcopy(s.state_dict()) for s in scalers]
    rng = capture_rng()
    weights_back: Callable[[], None] = _nothing
    try:  # an interrupt after the weights' backup puts them back
        weights_back = back_up_weights(model)

        def put_back() -> None:
            weights_back()
            if opt is not None and state is not None:
                live = state_of(opt)
                live.clear()
                live.update(state)
                for group, kept in zip(opt.param_groups, groups, strict=True):
                    group.clear()
                    group.update(kept)
            for s, kept_state in zip(roots, schedulers, strict=True):
                s.load_state_dict(kept_state)  # type: ignore[attr-defined]
            vars(amp).clear()
            vars(amp).update(precision)
            for s, kept_state in zip(scalers, scaler_states, strict=True):
                s.load_state_dict(kept_state)
            restore_rng(rng)

        return put_back
    except BaseException:
        weights_back()
        raise
