"""A file's commands made again on a freshly built model, in time linear in their number.

The engine is deterministic: the same commands from the same structure end in the same
structure. So when the structure after command ``k`` is the one after an earlier command
``i`` and the commands that follow repeat ``i+1 … k`` (``%freeze layer1`` / ``%unfreeze
layer1`` a thousand times), each repetition leaves the structure as it is and is not run
again: its records are copied into the history (the same change, listed and sealed as
the others), and the result is the full replay's, record for record. The structure
compared is everything a command reads or writes, by name: the modules (class, plain
attributes, hooks), the flags, the param groups (members and hyper-parameters), each
parameter's home group, the schedulers' states, the BatchNorm policies, the label maps
and the class names. With an EMA copy bound, every command runs: a copy's replaced head
keeps the weights its replacement drew, which the file does not hold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..checkpoint.records import bn_policies, label_maps
from ..integrations.lookup import state_of
from ..registry import REGISTRY
from ..surgery import edits, scheduler_sync
from ..surgery.results import Replay

if TYPE_CHECKING:
    from .facade import Session

PLAIN = (bool, int, float, str, type(None))


def replay(
    session: Session,
    target: edits.BoundModel,
    saved: Sequence[dict],
    calls: Sequence[tuple[str, Replay]],
    run: Callable[[Replay, str], None],
) -> None:
    """Run each of ``calls`` (``saved``: the file's entries, compared to find repetitions)
    through ``run``, or copy the records of a repetition."""
    history = session._history
    seen = {structure(session, target): 0}
    made: list = []  # the records of this replay, by position
    done = 0
    copying = not target.ema_copies  # an EMA copy's new head: weights the file lacks
    while done < len(calls):
        command, call = calls[done]
        first = history.next_index()
        run(call, command)
        if history.next_index() == first:  # it changed nothing here: copy nothing after it
            copying = False
        made.append(history.latest())
        done += 1
        now = structure(session, target)
        start = seen.get(now)
        seen[now] = done
        if start is None or not copying:
            continue
        end = done  # commands start … end-1 led from this structure back to it
        while (
            done + end - start <= len(calls)
            and saved[done : done + end - start] == saved[start:end]
        ):
            for record in made[start:end]:
                made.append(history.repeat(record))
            done += end - start


def structure(session: Session, target: edits.BoundModel) -> tuple:
    """What the next command depends on and the file is checked against, by name."""
    model, opt = target.model, target.optimizer
    modules = tuple(
        (
            name,
            type(m).__qualname__,
            len(m._forward_hooks),
            len(m._forward_pre_hooks),
            tuple((k, v) for k, v in vars(m).items() if isinstance(v, PLAIN)),
        )
        for name, m in model.named_modules()
    )
    named = list(model.named_parameters())
    flags = tuple(p.requires_grad for _, p in named)
    groups: tuple = ()
    homes: tuple = ()
    if opt is not None:
        names = {id(p): n for n, p in named}
        groups = tuple(
            (
                tuple(names.get(id(p), "?") for p in g["params"]),
                tuple(sorted((k, repr(v)) for k, v in g.items() if k != "params")),
            )
            for g in opt.param_groups
        )
        known = REGISTRY.homes.get(opt)
        if known is not None:
            home = known.indexer(opt)
            homes = tuple(home(p) for _, p in named)
        groups = (*groups, len(state_of(opt)))
    schedules = tuple(
        repr(s.state_dict())  # type: ignore[attr-defined]
        for s in scheduler_sync.roots(target.schedulers)
    )
    labels = repr(label_maps(model)), session.class_names.given(model)
    return modules, flags, groups, homes, schedules, tuple(bn_policies(model).items()), labels
