"""The doctor's look at a Session's namespace, with what only the session knows: its AMP
policy and device, compiled models as first seen, the weights each model was loaded
with, the heads it replaced, its fits, the last pinned-memory timing and the models whose
undo history another session holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..diagnostics.doctor import DoctorReport, diagnose
from ..modules import unwrap
from ..surgery.history import history_of

if TYPE_CHECKING:
    from .facade import Session


def doctor(session: Session) -> DoctorReport:
    workspace = session.workspace
    return diagnose(
        workspace.namespace,
        hidden=workspace.hidden,
        amp=session.amp,
        compile_watch=session.compile_watch,
        device=session.device,
        weights=session.loaded,
        replaced_heads={e.model_name for e in session.history() if e.action == "replace_head"},
        fits=session.fits,
        pinbench=session.last_pinbench,
        histories_elsewhere=_histories_elsewhere(session),
    )


def _histories_elsewhere(session: Session) -> dict[str, str]:
    """Model name → the owner of its history, for the models whose history this session
    cannot take (``shared.join`` refuses: its own has commands)."""
    mine = session._history
    if mine.blank():
        return {}
    elsewhere = {}
    for name, model in session.workspace.models().items():
        theirs = history_of(unwrap(model))
        if theirs is not None and theirs is not mine:
            elsewhere[name] = theirs.owner
    return elsewhere
