"""The engine: plain Python + torch, no IPython, no rich. Also the public scripting API."""

from .checkpoint import ResumeReport, SaveReport
from .distributed import rewrap
from .errors import TorchMagicError
from .evaluation import (
    EvaluateOptions,
    Evaluation,
    Prediction,
    Predictions,
    PredictOptions,
)
from .export import ExportReport
from .session import Session, SessionConfig, resume
from .sharding import ShardReport
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
    "EvaluateOptions",
    "Evaluation",
    "ExportReport",
    "GroupInfo",
    "HistoryEntry",
    "PredictOptions",
    "Prediction",
    "Predictions",
    "ResumeReport",
    "SaveReport",
    "Session",
    "SessionConfig",
    "ShardReport",
    "SummaryReport",
    "SummaryRow",
    "TorchMagicError",
    "resume",
    "rewrap",
]
