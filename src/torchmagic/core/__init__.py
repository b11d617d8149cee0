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
from .options import (
    FineTuneOptions,
    FitOptions,
    FreezeOptions,
    LoraOptions,
    LrFindOptions,
    ReplaceHeadOptions,
    UnfreezeOptions,
)
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
    "ExportOptions",
    "ExportReport",
    "FineTuneOptions",
    "FitOptions",
    "FreezeOptions",
    "GroupInfo",
    "HistoryEntry",
    "InferenceReport",
    "LoraOptions",
    "LrFindOptions",
    "PredictOptions",
    "Prediction",
    "Predictions",
    "ReplaceHeadOptions",
    "ResumeReport",
    "SaveReport",
    "Session",
    "SessionConfig",
    "ShardReport",
    "SummaryReport",
    "SummaryRow",
    "TorchMagicError",
    "UnfreezeOptions",
    "resume",
    "rewrap",
]
