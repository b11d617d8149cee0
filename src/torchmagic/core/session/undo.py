"""The Session's history of commands: which records can still be undone (and releasing
those that cannot), undo itself, and the refusals that keep an undo from leaving a model
and its live optimizer inconsistent. The records are kept by ``core.surgery.history``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ..advice import as_advice, spelled
from ..devices.hostmem import machine_memory
from ..errors import TorchMagicError
from ..modules import unique_parameters, unwrap, walk_model
from ..surgery.counting import describe_groups, group_keys
from ..surgery.edits import BoundModel, measure
from ..surgery.history import DROPPED, REBOUND, REPLAYED, SHARDED, ByteCap, Record, byte_cap
from ..surgery.results import Change, Effect
from ..surgery.transaction import uninterrupted
from . import invariants, names

if TYPE_CHECKING:
    from .facade import Session


def cap(session: Session) -> ByteCap:
    """The bytes the undo history may keep alive, and why that many."""
    return byte_cap(session.config.history_bytes, machine_memory()[1])


def dropped(session: Session, n: int) -> str:
    """What a command says when the history dropped its ``n`` oldest records to take it."""
    limits = session.history_cap()
    return (
        f"undo history full: the oldest {n} command{'s' if n > 1 else ''} can no longer "
        f"be undone (history_limit {session.config.history_limit} commands; history_bytes "
        f"{limits.nbytes} bytes, {limits.reason})"
    )


def prune(session: Session) -> None:
    """Release the records that can no longer be undone (see :func:`_stale`)."""
    session._history.release(lambda record: _stale(session, record))


def _stale(session: Session, record: Record) -> str:
    """Why ``record`` can no longer be undone ("" while it can): its model is not bound
    to its variable any more, or the optimizer it edited was re-created; judged in the
    namespace that named them (a shared history's other session's, while it lives)."""
    workspace = record.recorder() if record.recorder is not None else session.workspace
    if workspace is None:  # its session is gone, and its names with it: the objects tell
        if record.model() is None:
            return REBOUND
        dead = record.optimizer is not None and record.optimizer() is None
        return "optimizer re-created" if dead else ""
    bound = workspace.module(record.change.model_name)
    model = record.model()
    if model is None or bound is None or unwrap(bound) is not model:
        return REBOUND
    if record.optimizer is not None:
        now = workspace.optimizer(record.change.optimizer_name or "")
        if now is not record.optimizer():
            return "optimizer re-created"
    return ""


def undo(session: Session) -> Change:
    """Revert the newest command still applying to a bound model, atomically."""
    session.prune_history()
    record = session._history.newest(_seen_by(session))
    _refuse_undo(session, record)
    tx = record.tx
    assert tx is not None  # checked by _refuse_undo
    model = record.model()
    assert model is not None  # bound, so alive
    opt = None if record.optimizer is None else record.optimizer()
    workspace = session.workspace
    schedulers = workspace.schedulers(opt) if opt is not None else []
    copies, unclear = workspace.ema_copies(model)
    walked = walk_model(model)
    name = record.change.model_name
    target = BoundModel(
        model,
        name,
        walked,
        opt,
        record.change.optimizer_name,
        list(schedulers),
        workspace.names(),
        ema_copies=copies,
        ema_unclear=unclear,
        others=names.other_optimizers(workspace, workspace.found(), name, model, walked, opt),
    )
    before = measure(target, target.walked)
    observed = invariants.observe(target, before)
    if isinstance(record.observed, invariants.Observed):  # what it was before the command
        observed = observed.also(record.observed)

    def revert() -> dict:
        groups = group_keys(opt)
        tx.revert()  # its first inverse takes the record out of the history
        return groups

    groups_before = uninterrupted(revert)
    after = measure(target, walk_model(model))
    invariants.check(target, observed, record.change.command, undone=True, measured=after)
    return replace(
        record.change,
        effect=Effect(record.change.effect.modules, record.change.effect.params),
        action="undo",
        command=("undo ", *as_advice(record.change.command)),
        before=before.counts,
        after=after.counts,
        groups=describe_groups(opt, groups_before, target.schedulers, target.names),
    )


def _seen_by(session: Session) -> Callable[[Record], bool]:
    """Whether a record is the session's to undo: recorded by it, or on one of its
    models (a shared history also holds another session's other models)."""
    workspace = session.workspace
    models = {id(unwrap(m)) for m in workspace.models().values()}
    return lambda record: (
        record.recorder is None or record.recorder() is workspace or id(record.model()) in models
    )


def _refuse_undo(session: Session, record: Record) -> None:
    """Refuse, before anything changes, an undo that would leave the model and its
    live optimizer inconsistent."""
    command = spelled(record.change.command)
    fix = "make the opposite change instead, or clear the history"
    if record.stale == REPLAYED:
        raise TorchMagicError(
            f"cannot undo {command}: it was replayed from a checkpoint, and resumed "
            "commands cannot be undone"
        )
    if record.stale == DROPPED:
        raise TorchMagicError(
            f"cannot undo {command}: the session that made it was dropped, and its undo "
            f"log with it; {fix}"
        )
    if record.stale == SHARDED:
        raise TorchMagicError(
            f"cannot undo {command}: fully_shard has sharded the model since, and its undo "
            f"would put back the unsharded tensors; {fix}"
        )
    if record.tx is None:
        raise TorchMagicError(
            f"cannot undo {command}: the optimizer it edited, "
            f"'{record.change.optimizer_name}', was re-created since, and undoing would "
            f"make parameters trainable that the new one does not hold; {fix}"
        )
    if record.optimizer is None:
        model = record.model()
        assert model is not None  # bound: not stale
        name, now = session.workspace.resolve_optimizer(
            record.change.model_name, model, parameters=unique_parameters([model])
        )
        if now is not None:
            held = {id(p) for g in now.param_groups for p in g["params"]}
            missing = sum(id(p) not in held for p in record.tx.trains_after_undo)
            kept = sum(id(p) in held for p in record.tx.stops_after_undo)
            if missing or kept:
                what = (
                    f"make {missing} parameter tensors trainable that it does not hold"
                    if missing
                    else f"leave {kept} parameter tensors in it that would no longer train"
                )
                raise TorchMagicError(
                    f"cannot undo {command}: it ran without an optimizer and '{name}' "
                    f"holds the model's parameters now; undoing would {what}; {fix}"
                )
    reason = record.tx.refusal()
    if reason:
        raise TorchMagicError(f"cannot undo {command}: {reason}; {fix}")
