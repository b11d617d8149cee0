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
from .export import ExportOptions, ExportReport, InferenceReport
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
    "ExportOptions",
    "ExportReport",
    "GroupInfo",
    "HistoryEntry",
    "InferenceReport",
    "EvaluateOptions",
    "Evaluation",
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
