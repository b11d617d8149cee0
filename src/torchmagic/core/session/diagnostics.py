"""The doctor's look at a Session's namespace, with what only the session knows: its AMP
policy and device, compiled models as first seen, the weights each model was loaded
with, the heads it replaced, its fits, the last pinned-memory timing and its undo history
(whose models' histories another session may hold)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..diagnostics.doctor import DoctorReport, diagnose

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
        history=session._history,
    )
