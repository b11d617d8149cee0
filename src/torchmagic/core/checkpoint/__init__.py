"""A session's training state in one file that a fresh process continues from, bit for bit
(see :mod:`.records` for what the file holds)."""

from .files import read, write
from .records import (
    FORMAT,
    REPLAYABLE,
    VERSION,
    ResumeReport,
    SaveReport,
    capture,
    class_name,
    plain,
    summarize_resume,
    summarize_save,
)
from .restore import keep_states, load_precision, load_rng, load_states, replays
from .verify import check_fresh, check_replayed

__all__ = [
    "FORMAT",
    "REPLAYABLE",
    "VERSION",
    "ResumeReport",
    "SaveReport",
    "capture",
    "check_fresh",
    "check_replayed",
    "class_name",
    "keep_states",
    "load_precision",
    "load_rng",
    "load_states",
    "plain",
    "read",
    "replays",
    "summarize_resume",
    "summarize_save",
    "write",
]
