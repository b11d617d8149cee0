"""The engine: plain Python + torch, no IPython, no rich. Also the public scripting API."""

from .distributed import rewrap
from .errors import TorchMagicError
from .session import Session, SessionConfig
from .surgery.results import (
    Change,
    Counts,
    Effect,
    GroupInfo,
    HistoryEntry,
    SummaryReport,
    SummaryRow,
)

__all__ = [
    "Change",
    "Counts",
    "Effect",
    "GroupInfo",
    "HistoryEntry",
    "Session",
    "SessionConfig",
    "SummaryReport",
    "SummaryRow",
    "TorchMagicError",
    "rewrap",
]
