"""An undo log: every mutation registers its inverse, so a failed command rolls back
and ``undo`` replays the inverses in reverse order."""

from __future__ import annotations

from collections.abc import Callable


class Transaction:
    """Inverse actions of one command, run newest first by :meth:`revert`.

    ``on_commit`` callbacks run once when the command has succeeded; they let an action
    record what it finally touched (e.g. which param groups changed) before undo needs it.
    """

    def __init__(self) -> None:
        self._inverses: list[Callable[[], object]] = []
        self._on_commit: list[Callable[[], None]] = []

    def add(self, inverse: Callable[[], object]) -> None:
        """Record ``inverse`` (its return value is ignored)."""
        self._inverses.append(inverse)

    def on_commit(self, callback: Callable[[], None]) -> None:
        self._on_commit.append(callback)

    def commit(self) -> None:
        for callback in self._on_commit:
            callback()
        self._on_commit.clear()

    def revert(self) -> None:
        while self._inverses:
            self._inverses.pop()()

    def set_attr(self, obj: object, name: str, value: object) -> None:
        """``setattr`` with its inverse recorded."""
        old = getattr(obj, name)
        setattr(obj, name, value)
        self.add(lambda: setattr(obj, name, old))
