"""The session's record of mutating commands, newest last, each with its undo log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..errors import TorchMagicError
from .results import Change, HistoryEntry
from .transaction import Transaction


@dataclass
class Record:
    index: int
    change: Change
    model: nn.Module
    tx: Transaction


class History:
    def __init__(self) -> None:
        self._records: list[Record] = []
        self._next = 1
        self.undone: list[str] = []  # commands reverted by undo, oldest first

    def push(self, change: Change, model: nn.Module, tx: Transaction) -> None:
        self._records.append(Record(self._next, change, model, tx))
        self._next += 1

    def entries(self, is_live: Callable[[Record], bool]) -> tuple[HistoryEntry, ...]:
        return tuple(
            HistoryEntry(
                index=r.index,
                command=r.change.command,
                action=r.change.action,
                model_name=r.change.model_name,
                modules=r.change.effect.modules,
                live=is_live(r),
            )
            for r in self._records
        )

    def pop_live(self, is_live: Callable[[Record], bool]) -> Record:
        """The newest record whose model is still bound to its variable.

        Records of rebound models stay listed (marked stale) but are never undone: their
        objects are no longer what the user's variable names.
        """
        for i in range(len(self._records) - 1, -1, -1):
            if is_live(self._records[i]):
                record = self._records.pop(i)
                self.undone.append(record.change.command)
                return record
        raise TorchMagicError("nothing to undo")
