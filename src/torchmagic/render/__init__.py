"""The render layer: every rich renderable lives here, one module per concern.

``render(result, width)`` is the one entry point: it dispatches on the result's type to
the drawing function registered below, so the table of what draws what is in one place.
The per-type functions stay importable for callers that already hold the type.
"""

from __future__ import annotations

from functools import singledispatch

from rich.console import Group
from rich.text import Text

from ..core.checkpoint import ResumeReport, SaveReport
from ..core.data import ImageFolders
from ..core.devices.batch_size import BatchSizeReport
from ..core.devices.compare import CompareReport
from ..core.devices.device import DeviceReport, MoveReport
from ..core.devices.estimate import Estimate
from ..core.devices.memory import CellMemory, MemoryReport, ResetReport
from ..core.devices.pinbench import PinReport
from ..core.devices.placement import CheckReport
from ..core.diagnostics.doctor import DoctorReport
from ..core.evaluation import Evaluation, Prediction, Predictions
from ..core.export import ExportReport, InferenceReport
from ..core.surgery.results import Change, CommandHistory, SummaryReport
from ..core.training.amp import AmpStatus
from ..core.training.fit_events import FitHistory
from ..core.training.lr_find import LrFindResult
from ..core.training.recipe import HEAD_PHASE, UNFROZEN_PHASE, FineTuneResult, OneCyclePhase
from ..core.zoo import LoadedModel
from . import (
    chart,
    checkpoint,
    compare,
    data,
    device,
    doctor,
    evaluation,
    lr_find,
    memory,
    progress,
    surgery,
    theme,
    training,
    zoo,
)
from .base import DEFAULT_WIDTH, Rendered, human, human_bytes, lr
from .help import MagicHelp, ManifestHelp, magic_help, manifest_help
from .progress import FitProgress, NotebookProgress, TerminalProgress
from .surgery import change, history, message, summary
from .training import FitRuns, HistoryView, amp_status, fit_history, fits


@singledispatch
def render(result: object, width: int | None = None) -> Rendered:
    """Draw any engine result (or a plain message string) as text and HTML."""
    raise TypeError(f"nothing renders a {type(result).__name__}")


def _command_history(result: CommandHistory, width: int | None = None) -> Rendered:
    return surgery.history(result.entries, width, result.undone)


def _fit_runs(result: FitRuns, width: int | None = None) -> Rendered:
    return training.fits(result.runs, width)


def _manifest_help(result: ManifestHelp, width: int | None = None) -> Rendered:
    return manifest_help(result.manifest, width)


def _fine_tune(result: FineTuneResult, width: int | None = None) -> Rendered:
    """The recipe as it ran: the freeze, the head's run, the unfreeze, the full run (the
    chart draws both runs); under a one-cycle schedule, what each phase's schedule was."""
    steps = [(result.freeze, result.head_fit), (result.unfreeze, result.full_fit)]
    parts = [(surgery.change(c, width).renderable, run) for c, run in steps if c is not None]
    if result.schedule is not None and parts:
        note = Text(
            f"each run under its own {result.schedule} schedule: head phase "
            f"{_phase_text(HEAD_PHASE)}, unfrozen phase {_phase_text(UNFROZEN_PHASE)}; "
            "after each, every group's lr is its base lr again",
            style=theme.style("dim"),
        )
        parts[0] = (Group(parts[0][0], note), parts[0][1])
    return training.fine_tune_runs(parts, width)


def _phase_text(phase: OneCyclePhase) -> str:
    return f"warm-up {100 * phase.pct_start:g} % from base/{phase.div:g}"


def _cell_memory(result: CellMemory, width: int | None = None) -> Rendered:
    return Rendered(Text(memory.cell_line(result)), width)


for _type, _draw in (
    (str, surgery.message),
    (Change, surgery.change),
    (SummaryReport, surgery.summary),
    (CommandHistory, _command_history),
    (ManifestHelp, _manifest_help),
    (MagicHelp, magic_help),
    (FitHistory, training.fit_history),
    (FitRuns, _fit_runs),
    (AmpStatus, training.amp_status),
    (DeviceReport, device.devices),
    (MoveReport, device.moved),
    (CheckReport, device.misplaced),
    (PinReport, device.pin_report),
    (MemoryReport, memory.memory),
    (ResetReport, memory.reset),
    (Estimate, memory.estimate),
    (BatchSizeReport, memory.batch_size),
    (CompareReport, compare.device_compare),
    (LoadedModel, zoo.loaded_model),
    (ImageFolders, data.image_folders),
    (CellMemory, _cell_memory),
    (DoctorReport, doctor.doctor),
    (LrFindResult, lr_find.lr_find),
    (FineTuneResult, _fine_tune),
    (SaveReport, checkpoint.saved),
    (ResumeReport, checkpoint.resumed),
    (ExportReport, checkpoint.exported),
    (InferenceReport, checkpoint.exported_for_inference),
    (Evaluation, evaluation.evaluation),
    (Prediction, evaluation.prediction),
    (Predictions, evaluation.predictions),
):
    render.register(_type, _draw)

__all__ = [
    "DEFAULT_WIDTH",
    "FitProgress",
    "FitRuns",
    "HistoryView",
    "MagicHelp",
    "ManifestHelp",
    "NotebookProgress",
    "Rendered",
    "TerminalProgress",
    "amp_status",
    "change",
    "chart",
    "fit_history",
    "fits",
    "history",
    "human",
    "human_bytes",
    "lr",
    "manifest_help",
    "message",
    "progress",
    "render",
    "summary",
    "theme",
]
