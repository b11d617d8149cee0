"""The Session on several processes: its model sharded with FSDP2 (the optimizer
following, see ``core.sharding``), and what a save and a resume check first so that a
sharded run continues the one documented way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import nn

from .. import distributed, sharding
from ..errors import TorchMagicError
from ..surgery import edits
from ..surgery.history import SHARDED

if TYPE_CHECKING:
    from .facade import Session


def shard(
    session: Session,
    apply: Callable[[nn.Module], object],
    model: str | None,
    optimizer: str | None,
) -> sharding.ShardReport:
    target = session.bound(model, optimizer)
    try:
        return sharding.shard(target, apply)
    finally:
        if distributed.sharded_by(target.model) is not None:  # apply ran
            # their undo logs hold the unsharded tensors
            session._history.release(lambda r: SHARDED if r.model() is target.model else "")
            session.workspace.current = target.model_name


def check_shardable(session: Session) -> None:
    """``resume(..., shard=)`` refuses what :func:`shard` would, before the load."""
    target = session.bound()
    sharding.check_shardable(target.model, target.model_name, target.optimizer)


def refuse_sharded_resume(session: Session, target: edits.BoundModel, path: str) -> None:
    """A resume into a sharded model is refused, naming the order that works: the saved
    structure is replayed on the model as built (a new head cannot be sharded later)."""
    how = distributed.sharded_by(target.model, session.workspace.items())
    if how == "FullyShardedDataParallel":
        raise TorchMagicError(
            f"cannot resume from '{path}': '{target.model_name}' is inside "
            "FullyShardedDataParallel; resume into the model before wrapping it; "
            "nothing was changed"
        )
    if how is not None:
        raise TorchMagicError(
            f"cannot resume from '{path}': fully_shard has already sharded "
            f"'{target.model_name}'; build it unsharded and let torchmagic call your "
            f"fully_shard after the replay, {sharding.SHARD_CALL}; nothing was changed"
        )


def refuse_sharded_save(session: Session, target: edits.BoundModel, path: str) -> None:
    """A save file holds whole tensors for one process: a sharded model's would hold this
    rank's DTensors and a sharded class, which nothing can resume."""
    how = distributed.sharded_by(target.model, session.workspace.items())
    if how is not None:
        raise TorchMagicError(
            f"cannot save '{target.model_name}' to '{path}': {how} has sharded it, and the "
            "file holds whole tensors for one process; save before sharding, or save the "
            "sharded run with torch.distributed.checkpoint (dcp.save); nothing was written",
            param="path",
        )
