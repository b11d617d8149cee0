"""Surgery on models trained with DistributedDataParallel or FSDP.

DDP builds its gradient reducer once, from the parameters that require grad when the
wrapper is made. A freeze, unfreeze or new head after that leaves the reducer waiting for
gradients that never come (or ignoring new ones): ranks drift apart silently, then fail
with "Expected to have finished reduction". The fix is a new wrapper around the same
module, made on every rank after the same change: :func:`rewrap`. Until then a guard on
the stale wrapper refuses to run its forward. The wrappers are found whatever the session
was given: bound in its namespace, else (in a process group) among the live objects, since
DDP leaves no mark on the module it wraps (a wrapper made after ``resume``).

FSDP1 (``FullyShardedDataParallel``) keeps parameters in flat, sharded tensors, so nothing
can be edited per module after wrapping. FSDP2 (``fully_shard``) follows requires_grad
changes, but a new head or LoRA adapter would be a plain, unsharded module whose
gradients no rank reduces. Sharding a session's model with its optimizer: ``sharding``.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .errors import TorchMagicError
from .modules import unwrap, walk, wrapper_chain

_TRAINABLE = "_torchmagic_trainable"  # the parameters a DDP's reducer was built for
_RETIRED = "_torchmagic_retired"  # set on a wrapper rewrap has replaced
_VARIABLE = "_torchmagic_variable"  # the variable that binds a wrapper, for the refusal
_MIB = 1024 * 1024
# commands that put new layers into the model (what a fully_shard model cannot take)
_NEW_LAYERS = {
    "replace_head": ("replace the head of", "replace the head before calling fully_shard"),
    "lora": ("add LoRA adapters to", "add them before calling fully_shard"),
    "merge_lora": ("merge the LoRA adapters of", "merge them before calling fully_shard"),
}


def rewrap(ddp_model: DistributedDataParallel) -> DistributedDataParallel:
    """A new DistributedDataParallel around the same module, with the same settings, for
    the parameters that are trainable now. Call it on every rank after the same change.

    The optimizer is not needed: the new wrapper holds the same Parameter objects, and
    the broadcast from rank 0 (which also makes a new head identical on every rank)
    writes into them in place. Communication hooks registered with
    ``register_comm_hook`` are registered again. The old wrapper must not be used again:
    its forward raises.
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TorchMagicError(
            f"rewrap takes a DistributedDataParallel, got {type(ddp_model).__name__}",
            param="ddp_model",
        )
    if getattr(ddp_model, _RETIRED, False):
        raise TorchMagicError(
            "this DistributedDataParallel was already replaced by rewrap: "
            "pass the wrapper rewrap returned",
            param="ddp_model",
        )
    reason = _not_rewrappable(ddp_model)
    if reason is not None:
        raise TorchMagicError(f"cannot rewrap: {reason}", param="ddp_model")
    _check_ranks_agree(ddp_model)
    if not _reducer_parameters(ddp_model):
        raise TorchMagicError(
            "nothing in the model is trainable, and DistributedDataParallel needs at least "
            "one trainable parameter: unfreeze something first",
            param="ddp_model",
        )
    with warnings.catch_warnings():
        # Carrying broadcast_buffers=False over is deliberate (rank-local buffers).
        warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated", FutureWarning)
        new = DistributedDataParallel(ddp_model.module, **_settings(ddp_model))
    for hook, state in getattr(ddp_model, "_comm_hooks", ()):
        new.register_comm_hook(state, hook)
    _retire(ddp_model)
    _arm(new)
    if _VARIABLE in ddp_model.__dict__:
        new.__dict__[_VARIABLE] = ddp_model.__dict__[_VARIABLE]
    return new


def check_surgery(
    action: str, model: nn.Module, namespace_items: Iterable[tuple[str, object]]
) -> tuple[str, ...]:
    """Before ``action`` ("freeze", "unfreeze", "replace_head") edits ``model`` (unwrapped):
    refuse what a distributed wrapper cannot follow, arm the stale-wrapper guard on every
    DDP wrapper of ``model`` bound in the namespace, and return the notes to show (what
    every rank must do next)."""
    wrappers = _wrappers_of(model, namespace_items)
    _refuse_fsdp(action, model, wrappers)
    ddps = _ddp_wrappers(model, wrappers)
    for name, ddp in ddps:
        reason = _not_rewrappable(ddp)
        if reason is not None:
            held = f"'{name}' is" if name else "this model is held by"
            raise TorchMagicError(
                f"{held} a DistributedDataParallel that rewrap cannot rebuild "
                f"({reason}): make the change before wrapping"
            )
    notes = []
    for name, ddp in ddps:
        _arm(ddp, keep=True)
        ddp.__dict__[_VARIABLE] = name or ddp.__dict__.get(_VARIABLE) or "ddp_model"
        if name is None:
            name, held = "ddp_model", "a DistributedDataParallel the session was not given wraps it"
        else:
            held = f"'{name}' is a DistributedDataParallel"
        notes.append(
            f"{held}: make the same change on every rank, then on each call "
            f"{name} = torchmagic.rewrap({name}) before its next forward"
        )
    return tuple(notes)


def sharded_by(model: nn.Module, namespace_items: Iterable[tuple[str, object]] = ()) -> str | None:
    """How ``model`` (unwrapped) is sharded: "fully_shard" (FSDP2), "FullyShardedDataParallel"
    (FSDP1), or None."""
    if _has_fsdp1(model, _wrappers_of(model, namespace_items)):
        return "FullyShardedDataParallel"
    if _process_group() and (
        any(_is_a(m, "FSDPModule") for m in walk(model))
        or any(_is_a(p, "DTensor") for p in model.parameters())
    ):
        return "fully_shard"
    return None


def count_scope(model: nn.Module, namespace_items: Iterable[tuple[str, object]]) -> str | None:
    """What parameter counts of a sharded ``model`` mean: "per-rank" (FSDP1 holds this
    rank's flat shards), "gathered" (FSDP2's DTensors report full sizes), else None."""
    if _has_fsdp1(model, _wrappers_of(model, namespace_items)):
        return "per-rank"
    if _process_group() and any(_is_a(p, "DTensor") for p in model.parameters()):
        return "gathered"
    return None


# -- the stale-wrapper guard ---------------------------------------------------------


def _reducer_parameters(ddp: DistributedDataParallel) -> dict[int, nn.Parameter]:
    """The parameters DDP's reducer syncs, by identity: trainable, not ignored, each once."""
    ignored = ddp.parameters_to_ignore
    return {
        id(p): p
        for name, p in ddp.module.named_parameters()
        if p.requires_grad and name not in ignored
    }


def _arm(ddp: DistributedDataParallel, keep: bool = False) -> None:
    """Record the reducer's parameters (now) and refuse any forward once they change.
    ``keep``: a wrapper armed before keeps its first record (made closer to its build)."""
    if _TRAINABLE not in ddp.__dict__:
        ddp.register_forward_pre_hook(_refuse_stale_forward)
    elif keep:
        return
    ddp.__dict__[_TRAINABLE] = _reducer_parameters(ddp)


def _retire(ddp: DistributedDataParallel) -> None:
    """The old wrapper lets go of the parameters' autograd hooks and refuses to run."""
    if hasattr(ddp, "_remove_autograd_hooks"):
        ddp._remove_autograd_hooks()
    _arm(ddp, keep=True)
    ddp.__dict__[_TRAINABLE] = {}  # drop the references to replaced parameters
    ddp.__dict__[_RETIRED] = True


def _refuse_stale_forward(ddp: DistributedDataParallel, _inputs: tuple) -> None:
    if ddp.__dict__.get(_RETIRED):
        raise TorchMagicError(
            "this DistributedDataParallel was replaced by torchmagic.rewrap: "
            "use the wrapper rewrap returned"
        )
    # without grad the reducer takes no part: evaluating a stale wrapper is harmless
    if (
        torch.is_grad_enabled()
        and _reducer_parameters(ddp).keys() != ddp.__dict__[_TRAINABLE].keys()
    ):
        name = ddp.__dict__.get(_VARIABLE, "ddp_model")
        raise TorchMagicError(
            "the trainable parameters changed since this DistributedDataParallel was built, "
            "so its gradients would no longer be averaged across ranks: make the same change "
            f"on every rank, then on each call {name} = torchmagic.rewrap({name}) (the "
            "wrapper, not the module it wraps)"
        )


# -- what rewrap carries over ------------------------------------------------------


def _not_rewrappable(ddp: DistributedDataParallel) -> str | None:
    """Why a new wrapper could not reproduce ``ddp``, or None."""
    if getattr(ddp, "mixed_precision", None) is not None:
        return "its mixed_precision setting installs hooks on the module itself"
    if getattr(ddp, "_delay_all_reduce_params", None):
        return "it delays the all-reduce of some parameters"
    return None


def _settings(ddp: DistributedDataParallel) -> dict[str, Any]:
    """The constructor arguments ``ddp`` was made with, read back from its attributes
    (the ones this torch's DistributedDataParallel accepts)."""
    settings: dict[str, Any] = {
        "device_ids": ddp.device_ids,
        "output_device": ddp.output_device,
        "dim": ddp.dim,
        "find_unused_parameters": ddp.find_unused_parameters,
        "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
        "static_graph": ddp.static_graph,
    }
    mesh = getattr(ddp, "device_mesh", None)
    if mesh is not None:
        settings["device_mesh"] = mesh
    else:
        settings["process_group"] = ddp.process_group
    if not getattr(ddp, "bucket_bytes_cap_default", False):
        settings["bucket_cap_mb"] = ddp.bucket_bytes_cap / _MIB
    per_bucket = getattr(ddp, "bucket_bytes_cap_list", ())
    if per_bucket:
        settings["bucket_cap_mb_list"] = [cap / _MIB for cap in per_bucket]
    for name in ("skip_all_reduce_unused_params", "batched_grad_copy"):
        if hasattr(ddp, name):
            settings[name] = getattr(ddp, name)
    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    if ddp.broadcast_buffers and "forward_sync_buffers" in accepted:
        settings["forward_sync_buffers"] = True
    else:
        settings["broadcast_buffers"] = ddp.broadcast_buffers
    return {k: v for k, v in settings.items() if k in accepted}


def _fingerprint(ddp: DistributedDataParallel) -> tuple[str, int, int]:
    """(digest, trainable tensors, trainable elements) of the module's parameter layout."""
    digest = hashlib.sha256()
    tensors = numel = 0
    for name, p in ddp.module.named_parameters():
        digest.update(f"{name}:{tuple(p.shape)}:{p.dtype}:{p.requires_grad};".encode())
        if p.requires_grad:
            tensors += 1
            numel += p.numel()
    return digest.hexdigest(), tensors, numel


def _check_ranks_agree(ddp: DistributedDataParallel) -> None:
    """Every rank made the same change (a collective: all ranks raise alike, none hangs)."""
    group = ddp.process_group
    prints: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(prints, _fingerprint(ddp), group=group)
    if any(p[0] != prints[0][0] for p in prints):
        ranks = "; ".join(
            f"rank {r}: {tensors} trainable tensors ({numel:,} elements)"
            for r, (_, tensors, numel) in enumerate(prints)
        )
        raise TorchMagicError(
            f"the ranks' models differ ({ranks}): make the same change on every rank, "
            "then call rewrap on each",
            param="ddp_model",
        )


# -- finding wrappers and FSDP -------------------------------------------------------


def _wrappers_of(
    model: nn.Module, namespace_items: Iterable[tuple[str, object]]
) -> list[tuple[str, nn.Module]]:
    """(variable, wrapper) for every wrapper between a bound variable and ``model``."""
    found: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    for name, value in namespace_items:
        if not isinstance(value, nn.Module):
            continue
        chain = list(wrapper_chain(value))
        if chain[-1] is not model:
            continue
        for wrapper in chain[:-1]:
            if id(wrapper) not in seen:
                seen.add(id(wrapper))
                found.append((name, wrapper))
    return found


def _ddp_wrappers(
    model: nn.Module, wrappers: list[tuple[str, nn.Module]]
) -> list[tuple[str | None, DistributedDataParallel]]:
    """The DDP wrappers that train ``model`` now, by variable where the namespace binds
    one (retired ones skipped: rewrap has replaced them); else, in a process group, those
    alive anywhere (None for the name): a wrapper made after a resume, or around the raw
    module the session was given."""
    bound: list[tuple[str | None, DistributedDataParallel]] = [
        (name, w)
        for name, w in wrappers
        if isinstance(w, DistributedDataParallel) and not w.__dict__.get(_RETIRED)
    ]
    if bound or not (dist.is_available() and dist.is_initialized()):
        return bound
    return [(None, w) for w in _unbound_ddps(model)]


def _unbound_ddps(model: nn.Module) -> list[DistributedDataParallel]:
    """DDP leaves no mark on the module it wraps (its reducer's hooks live in C++), so the
    wrappers are found among the live objects: one pass over the collector's list, by
    exact class (87 ms of CPU over 345,000 objects: torch, torchvision and a resnet50)."""
    kinds = _subclasses(DistributedDataParallel)
    return [
        w
        for w in gc.get_objects()
        if type(w) in kinds and not w.__dict__.get(_RETIRED) and unwrap(w) is model
    ]


def _subclasses(cls: type) -> set[type]:
    found: set[type] = {cls}
    stack: list[type] = [cls]
    while stack:
        subs: list[type] = stack.pop().__subclasses__()
        for sub in subs:
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def _fsdp_parts(model: nn.Module) -> Iterator[nn.Module]:
    """FSDP1 wrappers and modules holding FSDP1 flat parameters inside ``model``."""
    for module in walk(model):
        if "_fsdp_wrapped_module" in module._modules or any(
            getattr(p, "_is_flat_param", False) for p in module._parameters.values()
        ):
            yield module


def _process_group() -> bool:
    """Whether a process group is initialised: FSDP wrappers, ``fully_shard`` modules and
    DTensors are built on one, so without it no model holds any and the walks looking
    for them (a millisecond each on a 700-module model, every command) are skipped."""
    return dist.is_available() and dist.is_initialized()


def _has_fsdp1(model: nn.Module, wrappers: list[tuple[str, nn.Module]]) -> bool:
    if any("_fsdp_wrapped_module" in w._modules for _, w in wrappers):
        return True
    return _process_group() and next(_fsdp_parts(model), None) is not None


def _refuse_fsdp(action: str, model: nn.Module, wrappers: list[tuple[str, nn.Module]]) -> None:
    if _has_fsdp1(model, wrappers):
        raise TorchMagicError(
            f"cannot {action.replace('_', ' ')} inside FullyShardedDataParallel: it keeps the "
            "parameters in flat, sharded tensors that cannot be edited per module; make the "
            "change before wrapping (or shard with FSDP2's fully_shard, which follows "
            "freezing and unfreezing)"
        )
    if action in _NEW_LAYERS and sharded_by(model) == "fully_shard":
        what, fix = _NEW_LAYERS[action]
        raise TorchMagicError(
            f"cannot {what} a fully_shard model: the layers it makes would not be sharded, "
            f"so no rank would reduce their gradients; {fix}"
        )


def _is_a(obj: object, class_name: str) -> bool:
    """By class name: FSDP2 and DTensor live in different modules across torch versions."""
    return any(cls.__name__ == class_name for cls in type(obj).__mro__)
