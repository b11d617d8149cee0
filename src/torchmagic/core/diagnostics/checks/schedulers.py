"""Schedulers: per-group lists out of step with their optimizer, schedulers the surgery
cannot follow, and schedulers of an optimizer no variable holds."""

from __future__ import annotations

from collections.abc import Iterator

from ...advice import Call
from ...surgery import scheduler_sync
from ...tensors import leaves
from ..context import DoctorContext
from ..findings import Finding
from ..registry import CheckGroup

checks = CheckGroup()


@checks.namespace
def schedulers(context: DoctorContext) -> Iterator[Finding]:
    ws = context.ws
    bound = set()
    for opt_name, opt in context.optimizers:
        n = len(opt.param_groups)
        for s in ws.schedulers(opt):
            bound.add(id(s))
            kind = type(s).__name__
            wrong = scheduler_sync.mismatches(s, opt)
            if wrong:
                yield Finding(
                    "scheduler",
                    "error",
                    f"{kind} on {opt_name}",
                    f"{'; '.join(wrong)} for {n} param groups: the next "
                    "scheduler.step() fails or schedules the wrong groups",
                    (
                        f"recreate the scheduler over {opt_name}; ",
                        Call("unfreeze", mention=True),
                        " / ",
                        Call("replace_head", mention=True),
                        " keep it in step from then on",
                    ),
                )
            reason = scheduler_sync.unfollowable(s, opt)
            if reason:
                yield Finding(
                    "scheduler",
                    "warning",
                    f"{kind} on {opt_name}",
                    f"{kind} holds {opt_name} but {reason}: %unfreeze with lr= and "
                    "%replace_head refuse to add a param group while it is bound",
                    "%unfreeze without lr= (parameters return to their home groups), or "
                    f"recreate the {kind} after the surgery",
                )
    everything = scheduler_sync.flatten(
        v
        for _, value in ws.items()
        for v in leaves(value, depth=1, kind=object)
        if scheduler_sync.is_scheduler(v)
    )
    for s in everything:
        if id(s) not in bound:
            yield Finding(
                "scheduler",
                "warning",
                type(s).__name__,
                f"{type(s).__name__} drives an optimizer no variable holds any more (the "
                "optimizer was recreated?): the one you train is not scheduled",
                "recreate the scheduler over the current optimizer",
            )
