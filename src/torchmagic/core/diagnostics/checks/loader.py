"""The loader sets the pace: the last run spent much of its time waiting for batches."""

from __future__ import annotations

import os
from collections.abc import Iterator

from torch.utils.data import DataLoader

from ..context import DoctorContext
from ..findings import Finding, first_names
from ..registry import CheckGroup

checks = CheckGroup()

# A run that waited for batches longer than this share of its wall time is reported.
DATA_WAIT_SHARE = 0.3


@checks.namespace
def data_wait(context: DoctorContext) -> Iterator[Finding]:
    """The last run's share of wall time spent waiting for the loader (``data_wait_s`` /
    ``wall_s`` of its history), with the usual remedies in the order they pay."""
    if not context.fits:
        return
    last, pin = context.fits[-1], context.pinbench
    wait, wall = getattr(last, "data_wait_s", None), getattr(last, "wall_s", None)
    if not isinstance(wait, (int, float)) or not isinstance(wall, (int, float)) or wall <= 0:
        return
    share = wait / wall
    if share <= DATA_WAIT_SHARE:
        return
    single = [n for n, v in context.ws.items() if isinstance(v, DataLoader) and v.num_workers == 0]
    workers = min(8, os.cpu_count() or 1)
    remedies = [
        f"num_workers={workers} (loading in {workers} processes"
        + (f"; {first_names(single)} load(s) in the main process now)" if single else ")")
    ]
    if getattr(pin, "ran", False):
        if getattr(pin, "recommend", False):
            remedies.append(
                f"pin_memory=True with .to(device, non_blocking=True) (pinbench measured "
                f"{getattr(pin, 'speedup', 0.0):.1f}x faster copies)"
            )
    else:
        remedies.append(
            "pin_memory=True with .to(device, non_blocking=True) on a GPU (pinbench measures it)"
        )
    remedies += [
        "persistent_workers=True (workers survive from one epoch to the next)",
        "lighter per-sample transforms (resize once ahead of time, cache decoded images)",
    ]
    label = getattr(last, "label", "the last run")
    yield Finding(
        "data-wait",
        "warning",
        label,
        f"{label} spent {share:.0%} of its wall time waiting for batches: the loader, not "
        "the model, sets the pace",
        "DataLoader(..., " + "; then ".join(f"{i}) {r}" for i, r in enumerate(remedies, 1)),
    )
