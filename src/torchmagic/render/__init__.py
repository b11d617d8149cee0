"""The render layer: every rich renderable lives here, one module per concern."""

from .base import Rendered, human, human_bytes
from .surgery import change, history, manifest_help, message, summary
from .training import (
    HistoryView,
    NotebookProgress,
    TerminalProgress,
    amp_status,
    fit_history,
    fits,
)

__all__ = [
    "HistoryView",
    "NotebookProgress",
    "Rendered",
    "TerminalProgress",
    "amp_status",
    "fit_history",
    "fits",
    "change",
    "history",
    "human",
    "human_bytes",
    "manifest_help",
    "message",
    "summary",
]
