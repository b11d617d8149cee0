"""A session's model sharded with FSDP2's ``fully_shard``, its optimizer following.

``fully_shard`` replaces every parameter it manages with a new DTensor parameter. An
optimizer made before it still holds the old, unsharded tensors, which no longer get
gradients: training runs without an error and no weight moves. And the param groups a
session made (blocks at their own base lr, the schedulers' per-group lists) and the
optimizer state of a resumed file would be lost with a new optimizer. So the session
runs the user's own ``fully_shard`` calls itself (:func:`shard`), knowing each tensor's
name from before: the parameters in the groups are swapped in place for the sharded
ones by name (the optimizer object, its groups, its schedulers and a GradScaler keep
working), and the state is sharded by torch's own engine, ``torch.distributed.checkpoint``:
``set_optimizer_state_dict`` with the full state keyed by name (``full_state_dict=True``),
as an FSDP2 script loads a full checkpoint. No sharding is home-made.

Two details of that engine are undone: it steps the optimizer once at lr 0 to make its
state, which gives a parameter that had none (unfrozen since the last step) a state at
step 1 (so its next Adam step would be corrected as a second one), and its
``load_state_dict`` makes new group dicts; the parameters keep the state they had (none)
and the groups their identity. Groups left empty by a freeze sit out of the call (the
engine accepts at most one).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import distributed
from .dtensors import is_dtensor, local_nbytes
from .errors import TorchMagicError
from .integrations.lookup import state_holder, state_of
from .modules import parameter_names
from .surgery import optimizer_sync
from .surgery.edits import BoundModel

_GUARDED = "_torchmagic_shard_guard"  # set on an optimizer whose steps are checked
SHARD_CALL = "torchmagic.resume(path, model, optimizer, schedulers, shard=shard)"


@dataclass(frozen=True)
class ShardReport:
    """What :func:`shard` did on this rank."""

    model_name: str
    optimizer_name: str | None
    parameters: int  # parameters of the model
    sharded: int  # of them now DTensors
    groups: int  # param groups of the optimizer (identity kept)
    states: int  # parameters whose optimizer state was sharded
    state_bytes: int  # of that state, on this rank
    world_size: int


def shard(target: BoundModel, apply: Callable[[nn.Module], object]) -> ShardReport:
    """``apply(model)`` (the user's ``fully_shard`` calls), then the optimizer's groups
    and state onto the sharded parameters (see the module docstring). Refused before
    ``apply`` runs when it cannot end well; the optimizer is left as it was if the state
    cannot be moved."""
    model, opt = target.model, target.optimizer
    check_shardable(model, target.model_name, opt)
    names = parameter_names(model)
    old = dict(model.named_parameters())
    apply(model)
    new = dict(model.named_parameters())
    _check_sharded(old, new, target.model_name)
    if opt is not None:
        _follow(model, state_holder(opt), names, new)
        optimizer_sync.rehome(opt, {id(p): new[n] for n, p in old.items() if n in new})
    return ShardReport(
        model_name=target.model_name,
        optimizer_name=target.optimizer_name,
        parameters=len(new),
        sharded=sum(is_dtensor(p) for p in new.values()),
        groups=0 if opt is None else len(opt.param_groups),
        states=0 if opt is None else len(state_of(opt)),
        state_bytes=0 if opt is None else _state_bytes(opt),
        world_size=dist.get_world_size(),
    )


def check_shardable(model: nn.Module, name: str, opt: torch.optim.Optimizer | None) -> None:
    """Why :func:`shard` cannot start, as a refusal; nothing has changed then."""
    if not (dist.is_available() and dist.is_initialized()):
        raise TorchMagicError(
            "shard needs a process group: call torch.distributed.init_process_group first "
            "(on every rank, as torchrun starts them)"
        )
    how = distributed.sharded_by(model)
    if how is not None:
        raise TorchMagicError(
            f"'{name}' is already sharded ({how}): shard once, the model as built (unsharded)"
        )
    if opt is None:
        return
    if not isinstance(opt, torch.optim.Optimizer):
        raise TorchMagicError(
            f"cannot shard the state of a {type(opt).__name__}: torch.distributed.checkpoint "
            "shards torch.optim optimizers"
        )
    own = {id(p) for p in model.parameters()}
    for i, group in enumerate(opt.param_groups):
        foreign = sum(id(p) not in own for p in group["params"])
        if foreign:
            raise TorchMagicError(
                f"param group {i} of the optimizer holds {foreign} tensors that are not "
                f"parameters of '{name}': it cannot follow the model's sharding"
            )


def _check_sharded(old: dict[str, nn.Parameter], new: dict[str, nn.Parameter], name: str) -> None:
    """``apply`` sharded the model and changed nothing else; said before the optimizer
    is touched."""
    missing = next((n for n in old if n not in new), None)
    if missing is not None or len(new) != len(old):
        odd = missing or next(n for n in new if n not in old)
        raise TorchMagicError(
            f"after the shard function, '{name}' has other parameters than before ('{odd}'): "
            "it may only call fully_shard; the optimizer was left as it was"
        )
    if not any(is_dtensor(p) for p in new.values()):
        raise TorchMagicError(
            f"the shard function sharded nothing in '{name}': call fully_shard on its "
            "blocks and on the model itself, with your device mesh"
        )


def _follow(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    names: dict[int, str],
    new: dict[str, nn.Parameter],
) -> None:
    """The groups' parameters swapped for ``new`` by name, the state sharded through
    torch.distributed.checkpoint (a collective: every rank calls it); on any failure,
    Ctrl-C included, the optimizer is put back as it was. ``opt`` is the optimizer that
    keeps the state (a Lookahead's base: the engine's step at lr 0 must not count as a
    lookahead step)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    groups = opt.param_groups
    settings = [dict(g) for g in groups]
    members = [list(g["params"]) for g in groups]
    state = opt.state
    full: dict[str, Any] = {
        "state": {names[id(p)]: dict(s) for p, s in state.items() if s},
        "param_groups": [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in ps]}
            for g, ps in zip(groups, members, strict=True)
            if ps
        ],
    }
    stateless = [
        new[names[id(p)]] for ps in members for p in ps if names[id(p)] not in full["state"]
    ]
    try:
        for group, params in zip(groups, members, strict=True):
            group["params"][:] = [new[names[id(p)]] for p in params]
        opt.state = defaultdict(dict)
        opt.param_groups = [g for g in groups if g["params"]]  # DCP takes one empty at most
        set_optimizer_state_dict(
            model, opt, full, options=StateDictOptions(full_state_dict=True, strict=False)
        )
        opt.param_groups = groups  # load_state_dict made new group dicts: ours again
        for p in stateless:  # DCP's step at lr 0 gave them a state
            opt.state.pop(p, None)
    except BaseException:
        opt.param_groups = groups
        for group, saved, params in zip(groups, settings, members, strict=True):
            group.clear()
            group.update(saved)
            group["params"][:] = params
        opt.state = state
        raise


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        local_nbytes(v)
        for s in state_of(opt).values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )


# -- the stale optimizer's guard -----------------------------------------------------


def guard_unsharded_steps(model: nn.Module, opt: torch.optim.Optimizer | None) -> None:
    """From now on ``opt.step()`` refuses when ``fully_shard`` has replaced ``model``'s
    parameters and ``opt`` still holds the old ones (its step would train nothing). Cheap:
    a step with any gradient in the optimizer passes at the first one it finds."""
    if opt is None or not isinstance(opt, torch.optim.Optimizer) or opt.__dict__.get(_GUARDED):
        return
    ref = weakref.ref(model)

    def refuse_unsharded_step(optimizer: torch.optim.Optimizer, _args: tuple, _kw: dict) -> None:
        groups = optimizer.param_groups
        if any(p.grad is not None for g in groups for p in g["params"]):
            return
        live = ref()
        if live is None or any(is_dtensor(p) for g in groups for p in g["params"]):
            return
        if any(is_dtensor(p) for p in live.parameters()):
            raise TorchMagicError(
                "this optimizer holds the parameters from before fully_shard, so its step "
                "would train nothing: build the model again and let torchmagic call your "
                f"fully_shard, {SHARD_CALL}"
            )

    opt.register_step_pre_hook(refuse_unsharded_step)
    opt.__dict__[_GUARDED] = True
