"""The Session's settings a user can change (the magics mirror them as traitlets)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SessionConfig:
    """Defaults a user can change (the magics mirror them as traitlets)."""

    bn_policy: str = "eval"
    unfreeze_lr_ratio: float = 0.1
    summary_depth: int = 2
    summary_max_rows: int = 60
    history_limit: int = 100  # commands kept for undo (the newest is always kept)
    # bytes of tensors the undo history may keep alive; None: a quarter of the machine's
    # RAM, at least 1 GiB (see ``core.surgery.history.byte_cap``)
    history_bytes: int | None = None
