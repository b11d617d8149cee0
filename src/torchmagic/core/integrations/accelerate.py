"""Hugging Face Accelerate: ``accelerator.prepare`` hands back wrappers that delegate to
the user's own optimizer and scheduler (stepping through the wrapper steps the inner
one, so editing the inner object keeps the wrapper working)."""

from __future__ import annotations

# wrapper class → the documented attribute holding what it wraps
WRAPS = {"AcceleratedOptimizer": "optimizer", "AcceleratedScheduler": "scheduler"}


def members(obj: object) -> list[tuple[str, object]]:
    """Nothing beyond the public attributes: the prepared objects are what users hold."""
    return []
