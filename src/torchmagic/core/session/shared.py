"""One model, one history. A Session takes the history that already holds commands on
its model (the notebook's magics and a Python ``Session`` on one model undo in one order,
never each other's commands behind their backs), and every command, undo and fit holds
that history's lock, so two threads' commands on one model never interleave: a command
waits for another command to end, and is refused in one line while a fit runs.

A session whose own history already holds commands cannot take another's: it is refused
by the other session's name (who created it), as two histories of one model would be."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, TypeVar

from torch import nn

from ..errors import TorchMagicError
from ..modules import unwrap
from ..surgery.history import History, history_of
from ..surgery.transaction import uninterrupted

if TYPE_CHECKING:
    from .facade import Session

F = TypeVar("F", bound=Callable)

WAIT_S = 0.05  # how often a waiting command looks whether a fit took the lock meanwhile


def default_owner(model: nn.Module | None) -> str:
    """How a refusal names a Session created without ``owner=``: by what it was given."""
    if model is None:
        return "a Python Session on a namespace"
    return f"a Python Session on a {type(unwrap(model)).__name__}"


def join(session: Session, model: nn.Module, name: str) -> None:
    """Make ``session`` use the history that holds commands on ``model`` (unwrapped):
    taken when its own is blank, refused by the other's name when its own has commands;
    with no history alive, the commands a dropped session made on it are adopted."""
    theirs = history_of(model)
    mine = session._history
    if theirs is None:  # commands of a session since dropped, if any, become this one's
        mine.adopt(model)
        return
    if theirs is mine:
        return
    if not mine.blank():
        raise TorchMagicError(
            f"'{name}' has its undo history in another torchmagic session, "
            f"{theirs.owner}: one model has one history; run this from that session, or "
            "give this one a model of its own"
        )
    session._history = theirs


def adopt(session: Session) -> None:
    """A blank session takes the history of the models bound to its variables (a lookup
    each, no walk: a hand-written loop's ``step`` comes here every batch); it never
    refuses, having no commands of its own."""
    if session._history.blank():
        for name, value in session.workspace.items():
            if isinstance(value, nn.Module):
                join(session, unwrap(value), name)


@contextmanager
def exclusive(session: Session, busy: str = "") -> Iterator[None]:
    """Hold the session's history for a command (re-entrant: a fit's own unfreezing
    runs inside it); ``busy``: what runs, for as long as a fit, so that other threads'
    commands are refused instead of waiting for it. A blank session first takes its
    models' history (:func:`adopt`), so that its first command (an undo too, which names
    no model) already holds the right lock."""
    adopt(session)
    history = session._history
    _acquire(history)
    marked = bool(busy) and not history.busy
    if marked:
        history.busy = busy
    try:
        yield
    finally:
        uninterrupted(lambda: _release(history, marked))


def _acquire(history: History) -> None:
    """The history's lock: at once when free or already this thread's; else wait while
    a command holds it, refuse while a fit does."""
    while not history.lock.acquire(timeout=WAIT_S):
        if history.busy:
            raise TorchMagicError(
                f"{history.busy} is running on this model in another thread; run this "
                "when it has ended (commands never interleave with a fit)"
            )


def _release(history: History, marked: bool) -> None:
    if marked:
        history.busy = ""
    history.lock.release()


def serialised(busy: str = "", *, pinned: bool = False) -> Callable[[F], F]:
    """A Session method run under :func:`exclusive` (``busy``: it trains, e.g. "a fit");
    ``pinned``: it binds no variable, so one walk of the namespace serves all of it
    (``Workspace.pinned``), the history's adoption included."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def held(self, *args, **kwargs):
            with self.workspace.pinned() if pinned else nullcontext(), exclusive(self, busy):
                return method(self, *args, **kwargs)

        return held  # type: ignore[return-value]

    return wrap
