"""The render layer: every rich renderable lives here, one module per concern."""

from .base import Rendered, human, human_bytes
from .surgery import change, history, manifest_help, message, summary

__all__ = [
    "Rendered",
    "change",
    "history",
    "human",
    "human_bytes",
    "manifest_help",
    "message",
    "summary",
]
