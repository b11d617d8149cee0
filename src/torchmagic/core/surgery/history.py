"""The session's record of mutating commands, newest last, each with its undo log.

Records hold their model and optimizer weakly. A record whose model is no longer bound to
its variable, or whose optimizer was re-created, is *released*: its undo log goes (so it
keeps no old model, optimizer or state alive) and its entry stays listed as stale. The log
is capped in entries and bytes: the oldest records go first; the newest always stays, so
the last command can always be undone whatever the caps.

The byte cap, unless the user sets one, is a share of the machine's RAM (:func:`byte_cap`):
what the history keeps (optimizer state set aside, replaced layers) lives in host memory,
and a fixed figure is either most of a small machine or a single command of a large model
(one freeze of 8 vit_h_14 blocks sets aside 1.2 GiB of AdamW state).

Apart from the undo log, the history keeps every command that still applies (all but
those undone), however old: a checkpoint replays them on a freshly built model. Those
commands are also kept, without their undo logs, in the registry under their model: a
session dropped takes its history with it, and the next session on the model takes them
over (:meth:`History.adopt`), listed but not undoable, so that its save replays them.

One model has one history: :func:`history_of` finds the history that recorded commands on
a model, so that a second session on it shares that one (``core.session.shared``), and
each history has the lock that keeps two threads' commands on its models from interleaving.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import nn

from ..advice import Command, spelled
from ..errors import TorchMagicError
from ..registry import REGISTRY
from .results import Change, HistoryEntry, Replay
from .transaction import Transaction

REBOUND = "model rebound"  # the stale reason undo skips over (other reasons refuse)
REPLAYED = "replayed from a checkpoint"  # a resumed command: listed, never undone
SHARDED = "model sharded since"  # fully_shard replaced the tensors its undo log holds
DROPPED = "made by a session since dropped"  # its undo log went with that session

RAM_SHARE = 4  # the automatic byte cap: a quarter of the machine's RAM …
MIN_CAP = 1 << 30  # … and at least 1 GiB (also where the RAM is unknown)


@dataclass(frozen=True)
class ByteCap:
    """The history's byte cap and why it is that (said when it drops commands)."""

    nbytes: int
    reason: str


def byte_cap(configured: int | None, total_ram: int | None) -> ByteCap:
    """The cap a session uses: ``configured`` when set, else ``1 / RAM_SHARE`` of the
    machine's ``total_ram`` bytes, at least ``MIN_CAP``."""
    if configured is not None:
        return ByteCap(configured, "as configured")
    if total_ram is None:
        return ByteCap(MIN_CAP, f"the default {_gib(MIN_CAP)}: this machine's RAM is unknown")
    share = total_ram // RAM_SHARE
    if share < MIN_CAP:
        return ByteCap(MIN_CAP, f"at least {_gib(MIN_CAP)}, on a machine of {_gib(total_ram)}")
    return ByteCap(
        share,
        f"a quarter of this machine's {_gib(total_ram)} of RAM, where set-aside state is kept",
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


@dataclass
class Record:
    index: int
    change: Change
    model: weakref.ReferenceType[nn.Module]
    optimizer: weakref.ReferenceType[torch.optim.Optimizer] | None
    tx: Transaction | None  # None once released: listed, never undone
    stale: str = ""  # why it was released
    replay: Replay | None = None  # the call that makes the command again
    observed: object = None  # the invariants' problems before it: its undo may put them back
    # what named the model (the recording session's workspace): judges "rebound" and the like
    recorder: weakref.ReferenceType | None = None


class Cleared(NamedTuple):
    """What ``clear`` dropped: records, and bytes their undo logs held."""

    commands: int
    nbytes: int


def history_of(model: nn.Module) -> History | None:
    """The history holding a command on ``model`` (none recorded, or all undone: None)."""
    ref = REGISTRY.histories.get(model)
    history = None if ref is None else ref()
    return history if history is not None and history.touches(model) else None


class History:
    def __init__(self, owner: str = "a Session") -> None:
        self._records: list[Record] = []
        self._next = 1
        self.undone: list[Command] = []  # commands reverted by undo, oldest first
        self._applied: list[Record] = []  # every command not undone, past limits and clear
        self.owner = owner  # who made it, as a refusal names it ("the notebook's magics")
        self.lock = threading.RLock()  # held by every command, undo and fit on its models
        self.busy = ""  # what holds the lock for long ("a fit"): other threads are refused
        self.keep_all = False  # a load replaying: no record dropped until it is sealed
        self.seals = 0  # loads sealed: a load whose seal came is complete, whatever follows

    def touches(self, model: nn.Module) -> bool:
        """Whether a command on ``model`` is in this history (listed or still applied)."""
        return any(r.model() is model for r in (*self._records, *self._applied))

    def blank(self) -> bool:
        """Nothing was ever recorded here (a new session's history, free to be replaced)."""
        return self._next == 1

    def push(
        self,
        change: Change,
        tx: Transaction,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        max_entries: int,
        max_bytes: int,
        replay: Replay | None = None,
        observed: object = None,
        recorder: object = None,
    ) -> int:
        """Record a committed command; undoing it (reverting ``tx``) also removes the
        record. Appending is the commit point: a record in the history is a command
        applied. ``observed``: what the invariants found before it, kept for its undo.
        Returns how many of the oldest records were dropped to keep within
        ``max_entries`` and ``max_bytes``. ``recorder``: the workspace that named the
        model (its staleness is judged there, whichever session prunes)."""
        tx.nbytes()  # measured (and kept) before the commit point: a failure here is a rollback
        record = Record(
            self._next,
            change,
            weakref.ref(model),
            None if optimizer is None else weakref.ref(optimizer),
            tx,
            replay=replay,
            observed=observed,
            recorder=None if recorder is None else weakref.ref(recorder),
        )
        tx.add(lambda: self._discard(record))
        self._next += 1
        self._applied.append(record)  # first: a rollback's _discard takes it out again
        self._records.append(record)
        REGISTRY.histories[model] = weakref.ref(self)
        REGISTRY.commands.setdefault(model, []).append(_without_undo(record))
        drop = self._overflow(max_entries, max_bytes)
        dropped = self._records[:drop]
        del self._records[:drop]
        for old in dropped:
            old.tx = None  # its undo log goes; the command stays applied
        return drop

    def _overflow(self, max_entries: int, max_bytes: int) -> int:
        """How many of the oldest records to drop so that the rest fit; never the newest."""
        if self.keep_all:
            return 0
        sizes = [r.tx.nbytes() if r.tx is not None else 0 for r in self._records]
        total, drop = sum(sizes), 0
        while drop < len(sizes) - 1 and (len(sizes) - drop > max_entries or total > max_bytes):
            total -= sizes[drop]
            drop += 1
        return drop

    def _discard(self, record: Record) -> None:
        """Undo's last step: the record leaves the history, its command joins ``undone``
        (idempotent: an interrupted undo runs it again)."""
        self._applied = [r for r in self._applied if r is not record]
        model = record.model()
        kept = REGISTRY.commands.get(model) if model is not None else None
        if kept is not None:
            kept[:] = [r for r in kept if r.index != record.index]
        if any(r is record for r in self._records):
            self._records = [r for r in self._records if r is not record]
            self.undone.append(record.change.command)

    def adopt(self, model: nn.Module) -> None:
        """Take over the commands on ``model`` that a history since collected (its
        session dropped) made: listed and applied here, numbered after this history's
        own, never undone (their undo logs are gone)."""
        taken = []
        for kept in REGISTRY.commands.get(model, ()):
            record = _without_undo(kept, index=self._next, stale=DROPPED)
            self._next += 1
            self._applied.append(record)
            self._records.append(record)
            taken.append(_without_undo(record))
        if taken:
            REGISTRY.commands[model] = taken
            REGISTRY.histories[model] = weakref.ref(self)

    def next_index(self) -> int:
        """The index the next record will take."""
        return self._next

    def newest_index(self) -> int:
        """The index of the newest applied record (0: none)."""
        return self._applied[-1].index if self._applied else 0

    def latest(self) -> Record:
        """The newest record (of the command just made)."""
        return self._applied[-1]

    def repeat(self, record: Record) -> Record:
        """A copy of ``record`` as the newest command, without an undo log: a load's
        replay found it would make the very same change again (see ``session.replay``)."""
        copy = _without_undo(record, index=self._next)
        self._next += 1
        self._applied.append(copy)
        self._records.append(copy)
        model = record.model()
        if model is not None:
            REGISTRY.commands.setdefault(model, []).append(_without_undo(copy))
        return copy

    def drop_copy(self) -> bool:
        """Take the newest record out if it holds no undo log (a copy :meth:`repeat`
        made, nothing to revert); False if it has one (undo reverts it)."""
        record = self._applied[-1] if self._applied else None
        if record is None or record.tx is not None:
            return False
        self._discard(record)
        return True

    def trim(self, max_entries: int, max_bytes: int) -> None:
        """Drop the oldest records beyond the limits (after a load's replay, sealed)."""
        drop = self._overflow(max_entries, max_bytes)
        for old in self._records[:drop]:
            old.tx = None
        del self._records[:drop]

    def holds(self, tx: Transaction) -> bool:
        """Whether ``tx`` is the undo log of a recorded (so: applied) command."""
        return any(r.tx is tx for r in self._records)

    def release(self, reason_of: Callable[[Record], str]) -> None:
        """Drop the undo log of every record ``reason_of`` gives a reason for."""
        for record in self._records:
            if record.tx is not None and (reason := reason_of(record)):
                record.tx, record.stale = None, reason

    def entries(self) -> tuple[HistoryEntry, ...]:
        return tuple(_entry(r) for r in self._records)

    def applied(self, model: nn.Module) -> tuple[HistoryEntry, ...]:
        """The commands that made ``model`` what it is now, oldest first: every one not
        undone, also those past the limits or cleared from the undo history."""
        return tuple(_entry(r) for r in self._applied if r.model() is model)

    def seal_replayed(self, count: int) -> None:
        """The newest ``count`` records were replayed from a checkpoint: they stay listed
        and applied, but cannot be undone (their undo logs hold a fresh model's state).
        Counting the seal comes first: it is the load's commit point, and sealing the
        records again (:meth:`sealed`) finishes an interrupted seal."""
        self.seals += 1
        self.sealed(count)

    def sealed(self, count: int) -> None:
        """The newest ``count`` records marked replayed and their undo logs dropped."""
        for record in self._records[len(self._records) - count :] if count else ():
            record.tx, record.stale = None, REPLAYED

    def newest(self, sees: Callable[[Record], bool] = lambda record: True) -> Record:
        """The newest record whose model is still bound (it may be stale for another
        reason: the caller refuses then). Records of rebound models are skipped, and so
        are those ``sees`` leaves out (a shared history's records of other models)."""
        seen = [r for r in self._records if sees(r)]
        for record in reversed(seen):
            if record.stale != REBOUND:
                return record
        if seen:  # the model cell re-run: say why the commands above do not count
            last = seen[-1].change
            raise TorchMagicError(
                f"nothing to undo: {spelled(last.command)} changed the model '{last.model_name}' "
                "named before it was re-bound (its cell re-run), not the one it names now"
            )
        raise TorchMagicError("nothing to undo")

    def nbytes(self, device_type: str | None = None) -> int:
        """Bytes the undo logs keep alive, on devices of ``device_type`` or on all."""
        return sum(r.tx.nbytes(device_type) for r in self._records if r.tx is not None)

    def clear(self) -> Cleared:
        cleared = Cleared(len(self._records), self.nbytes())
        for record in self._records:
            record.tx = None
        self._records = []
        return cleared


def _without_undo(record: Record, **changes: object) -> Record:
    """A copy of ``record`` holding no undo log and nothing of the session that made it
    (what the registry keeps beyond that session)."""
    return replace(record, tx=None, observed=None, recorder=None, **changes)  # type: ignore[arg-type]


def _entry(record: Record) -> HistoryEntry:
    return HistoryEntry(
        index=record.index,
        command=record.change.command,
        action=record.change.action,
        model_name=record.change.model_name,
        modules=record.change.effect.modules,
        live=record.tx is not None,
        stale=record.stale,
        replay=record.replay,
    )
