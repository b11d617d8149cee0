"""An undo log: every mutation registers its inverse, so a failed command rolls back
and ``undo`` replays the inverses in reverse order.

A command is atomic under Ctrl-C: :class:`Uninterrupted` holds SIGINT while it mutates
and delivers it after commit or rollback. Whatever raises part-way instead — a
``KeyboardInterrupt`` raised by other code, any ``BaseException`` — meets the same rules:
each inverse is registered *before* its mutation (and is harmless when the mutation never
happened), and :meth:`Transaction.revert` and :meth:`Transaction.commit` run to the end
once started (an interrupted step runs again: steps are idempotent).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import TypeVar

import torch

from ..dtensors import storages

Step = Callable[[], object]
T = TypeVar("T")


def run_to_end(steps: list[Step]) -> None:
    """Run ``steps`` newest first, popping each once it has run. A KeyboardInterrupt
    part-way runs the interrupted step again and the rest, then is raised: once started,
    the list is finished."""
    pending: KeyboardInterrupt | None = None
    while True:
        try:
            while steps:
                steps[-1]()
                steps.pop()
        except KeyboardInterrupt as interrupt:
            pending = interrupt
            continue
        break
    if pending is not None:
        raise pending


class Transaction:
    """Inverse actions of one command, run newest first by :meth:`revert`.

    ``on_commit`` callbacks run once when the command has succeeded; they let an action
    record what it finally touched (e.g. which param groups changed) before undo needs it.
    ``refuse_undo_if`` checks run before an undo touches anything; ``hold`` counts the
    tensors kept only for undo (what the history's byte limit measures).
    """

    def __init__(self) -> None:
        self._inverses: list[Step] = []
        self._on_commit: list[Step] = []
        self._checks: list[Callable[[], str | None]] = []
        self._held: list[torch.Tensor] = []
        self._nbytes: dict[str | None, int] = {}  # by device type, until more is held
        # parameters the undo makes trainable (or puts back into the model trainable), and
        # those it freezes (or takes out of the model): checked against an optimizer made
        # after a command that ran without one
        self.trains_after_undo: list[torch.Tensor] = []
        self.stops_after_undo: list[torch.Tensor] = []

    def add(self, inverse: Step) -> None:
        """Record ``inverse`` (its return value is ignored). Register it before the
        mutation it undoes, and make it idempotent and correct whether or not the
        mutation (or part of it) happened."""
        self._inverses.append(inverse)

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the command succeeds (idempotent, like inverses)."""
        self._on_commit.append(callback)

    def refuse_undo_if(self, check: Callable[[], str | None]) -> None:
        """``check`` says why undoing now would be inconsistent (None: it would not)."""
        self._checks.append(check)

    def hold(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count ``tensors`` as kept alive by this log alone."""
        self._held.extend(tensors)
        self._nbytes.clear()

    def commit(self) -> None:
        run_to_end(self._on_commit)

    def revert(self) -> None:
        """Run every inverse, newest first; finished even if interrupted part-way."""
        run_to_end(self._inverses)
        self._held.clear()
        self._nbytes.clear()

    def refusal(self) -> str | None:
        """Why undoing now would leave things inconsistent; None when it can go ahead."""
        return next((reason for check in self._checks if (reason := check())), None)

    def nbytes(self, device_type: str | None = None) -> int:
        """Bytes of the tensors this log keeps alive (each storage once), on devices of
        ``device_type`` or on all."""
        if device_type not in self._nbytes:
            held = {
                key: size
                for t in self._held
                if device_type is None or t.device.type == device_type
                for key, size in storages(t)  # a DTensor: its local shard's
            }
            self._nbytes[device_type] = sum(held.values())
        return self._nbytes[device_type]

    def set_attr(self, obj: object, name: str, value: object) -> None:
        """``setattr`` with its inverse recorded (first)."""
        old = getattr(obj, name)
        self.add(lambda: setattr(obj, name, old))
        setattr(obj, name, value)


class Uninterrupted:
    """Hold Ctrl-C while a command mutates: ``with Uninterrupted():``.

    On the main thread SIGINT is recorded instead of raised, and delivered to the previous
    handler (the default one raises KeyboardInterrupt) once the block has committed or
    rolled back. Grad mode is put back as it was on entry, so an interrupt inside
    ``torch.no_grad()`` cannot leave it off. Elsewhere (other threads, where signal
    handlers cannot be set) only grad mode is guarded.
    """

    def __init__(self) -> None:
        self._previous: Callable | int | None = None
        self._received: list[FrameType | None] = []
        self._grad_enabled = True
        self._installed = False

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._received.append(frame)

    def __enter__(self) -> Uninterrupted:
        self._grad_enabled = torch.is_grad_enabled()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._hold)
            self._installed = True
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        torch.set_grad_enabled(self._grad_enabled)
        if not self._installed:
            return
        # None: the handler was not set from Python and cannot be put back; use the default
        signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous is None else self._previous)
        self._installed = False
        if not self._received:
            return
        frame = self._received[0]
        self._received.clear()
        if callable(self._previous):
            self._previous(signal.SIGINT, frame)
        elif self._previous == signal.SIG_DFL:
            raise KeyboardInterrupt


def uninterrupted(action: Callable[[], T]) -> T:
    """``action()`` with Ctrl-C held until it has returned or raised (:class:`Uninterrupted`)."""
    with Uninterrupted():
        return action()
