"""The fixed choices Session parameters take, in one place a front end may read them from
(the magics' ``choices=`` and completion lists): precision modes, fine-tune schedules and
BatchNorm policies. The engine checks them where it uses them."""

from __future__ import annotations

MODES = ("auto", "bf16", "fp16")  # Session.amp_on(mode=…), Session.autocast(mode=…)
ONE_CYCLE = "one-cycle"
SCHEDULES = (ONE_CYCLE,)  # Session.fine_tune(schedule=…)
POLICIES = ("eval", "train", "frozen")  # Session.freeze(bn=…): see core.surgery.batchnorm

__all__ = ["MODES", "ONE_CYCLE", "POLICIES", "SCHEDULES"]
