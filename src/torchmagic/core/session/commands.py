"""The Session's mutating commands and how each one runs: validated first, then applied in
a transaction, recorded in the history (the commit point) and finished, or not at all, also
under Ctrl-C. Each command keeps the call that makes it again on a freshly built model (its
replay record: what a checkpoint and an exported script hold)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .. import distributed
from ..advice import Advice, Call, Command
from ..choices import POLICIES
from ..errors import TorchMagicError
from ..integrations import discovery
from ..modules import ModelWalk, unique_parameters, walk_model
from ..options import (
    FreezeOptions,
    LoraOptions,
    ReplaceHeadOptions,
    UnfreezeOptions,
    given_fields,
)
from ..surgery import edits, heads, lora, model_checks
from ..surgery.base_lrs import set_base_lrs as set_group_base_lrs
from ..surgery.counting import describe_groups, group_keys
from ..surgery.grammar import (
    LrSpec,
    check_positive,
    spread_lrs,
    suffix_list,
)
from ..surgery.results import Change, Effect, Replay, SummaryReport
from ..surgery.summary import summarize
from ..surgery.transaction import Transaction, uninterrupted
from . import invariants, names, shared, undo

if TYPE_CHECKING:
    from torch import nn

    from .facade import Session


@dataclass(frozen=True)
class Edit:
    """One surgery command as it runs: its action, how the history spells it, the live
    objects it acts on, the step that changes them, the call that replays it, and what the
    namespace said about it before it ran (``found``: the discovery walk; ``notes``)."""

    action: str
    command: Command
    target: edits.BoundModel
    step: Callable[[Transaction], Effect]
    dry_run: bool
    replay: Replay | None
    found: list
    notes: tuple[str, ...]


def run(
    session: Session,
    action: str,
    command: Command,
    target: edits.BoundModel,
    step: Callable[[Transaction], Effect],
    *,
    dry_run: bool = False,
    replay: Replay | None = None,
) -> Change:
    """Run ``step`` as one atomic command: applied and in the history, or not at all
    (also under Ctrl-C, which waits until the end). ``replay``: the call that makes
    it again on a freshly built model (what a checkpoint keeps)."""
    shared.join(session, target.model, target.model_name)  # one model, one history
    session.prune_history()
    notes = distributed.check_surgery(action, target.model, session.workspace.items())
    found = session.workspace.found()
    if target.optimizer is None:
        untended = discovery.untended_holder(found, target.model)
        if untended is not None:
            raise TorchMagicError(untended, param="optimizer")
        notes = (*notes, *discovery.optimizers_to_come(session.workspace.items(), target.model))
    edit = Edit(action, command, target, step, dry_run, replay, found, tuple(notes))
    change, dropped = uninterrupted(lambda: _apply(session, edit))
    if dropped:
        said = (*change.effect.notes, undo.dropped(session, dropped))
        change = replace(change, effect=replace(change.effect, notes=said))
    return change


def _apply(session: Session, edit: Edit) -> tuple[Change, int]:
    """The command in one transaction, in this order: the model measured (from the walk
    made when it was bound) and what is already wrong in it observed; the step; the
    model walked and measured again and the change described; then, unless it is a dry
    run or changed nothing, the invariants checked, the record pushed (the commit point)
    and the command finished. Anything raised before the commit point rolls it back.
    Returns the change and how many old records the history dropped."""
    target = edit.target
    tx = Transaction()
    before = edits.measure(target, target.walked)
    observed = invariants.observe(target, before)
    groups_before = group_keys(target.optimizer)
    try:
        effect = edit.step(tx)
        after = edits.measure(target, walk_model(target.model))
        change = _described(edit, effect, before, after, groups_before)
        if edit.dry_run or change.unchanged:  # nothing to keep: no history entry to undo
            tx.revert()
            return change, 0
        invariants.check(target, observed, change.command, measured=after)
        dropped = session._history.push(
            change,
            tx,
            model=target.model,
            optimizer=target.optimizer,
            max_entries=session.config.history_limit,
            max_bytes=session.history_cap().nbytes,
            replay=edit.replay,
            observed=observed,
            recorder=session.workspace,
        )
        _finish(session, target, tx)
        return change, dropped
    except BaseException:
        # recorded means applied: finish it; otherwise it never happened
        if session._history.holds(tx):
            _finish(session, target, tx)
        else:
            tx.revert()
        raise


def _described(
    edit: Edit,
    effect: Effect,
    before: edits.Measured,
    after: edits.Measured,
    groups_before: dict,
) -> Change:
    """The change ``effect`` made, with the notes of the namespace around it."""
    target, opt = edit.target, edit.target.optimizer
    if opt is not None and len(opt.param_groups) != len(groups_before):
        effect = replace(effect, notes=(*effect.notes, *discovery.resume_notes(edit.found, opt)))
    # what may undo or override this change on its own, named when it changed something
    holders = tuple(h.line for h in target.holders) if after.state != before.state else ()
    extra = tuple(n for n in (*edit.notes, *holders) if n not in effect.notes)
    return Change(
        action=edit.action,
        command=edit.command,
        model_name=target.model_name,
        effect=replace(effect, notes=effect.notes + extra),
        before=before.counts,
        after=after.counts,
        optimizer_name=target.optimizer_name,
        groups=describe_groups(opt, groups_before, target.schedulers, target.names),
        dry_run=edit.dry_run,
        unchanged=after.state == before.state,
    )


def _finish(session: Session, target: edits.BoundModel, tx: Transaction) -> None:
    """What follows a command's commit point; idempotent, so an interrupted one is
    simply run again."""
    tx.commit()
    session.workspace.current = target.model_name
    if target.optimizer_name is not None and not target.named:  # a named one: this command's
        session.workspace.remember(target.model_name, target.model, target.optimizer_name)


# -- the commands ------------------------------------------------------------------------


def freeze(
    session: Session,
    targets: Sequence[str],
    given: FreezeOptions,
    *,
    optimizer: str | None,
    dry_run: bool,
    command: Command | None,
) -> Change:
    policy = checked_bn(given.bn or session.config.bn_policy)
    options = replace(given, bn=policy)
    selected = names.selection(session.workspace, targets, options.exclude, optimizer)
    target, selection = selected.target, selected.selection
    return run(
        session,
        "freeze",
        command or call("freeze", *targets, **dict(given_fields(given))),
        target,
        lambda tx: edits.freeze(target, selection, policy, tx),
        dry_run=dry_run,
        replay=replay_of("freeze", selected, options),
    )


def unfreeze(
    session: Session,
    targets: Sequence[str],
    given: UnfreezeOptions,
    *,
    optimizer: str | None,
    dry_run: bool,
    command: Command | None,
) -> Change:
    wd = given.wd
    options = replace(
        given,
        lr=_checked_lr(given.lr),
        wd=None if wd is None else check_positive(wd, "wd", allow_zero=True),
    )
    selected = names.selection(session.workspace, targets, options.exclude, optimizer)
    target, selection = selected.target, selected.selection
    lrs = spread_lrs(options.lr, len(selection.blocks))
    _refuse_lr_setter(session, target, options.lr is not None)
    later = (
        discovery.optimizers_to_come(session.workspace.items(), target.model)
        + discovery.ways_to_build(session.workspace.items(), target.model)
        if target.optimizer is None
        else []
    )
    ratio = session.config.unfreeze_lr_ratio
    return run(
        session,
        "unfreeze",
        command or call("unfreeze", *targets, **dict(given_fields(given))),
        target,
        lambda tx: edits.unfreeze(
            target, selection, lrs, tx, weight_decay=options.wd, lr_ratio=ratio, later=later
        ),
        dry_run=dry_run,
        replay=replay_of("unfreeze", selected, options),
    )


def _refuse_lr_setter(session: Session, target: edits.BoundModel, lr_given: bool) -> None:
    """An lr the next fit would overwrite (a fastai Learner sets every group's) is
    refused, naming what overwrites it."""
    setter = (
        discovery.lr_setter(session.workspace.found(), target.optimizer)
        if lr_given and target.optimizer is not None
        else None
    )
    if setter is not None:
        raise TorchMagicError(f"lr= would not hold: {setter}", param="lr")


def replace_head(
    session: Session,
    where: str | None,
    given: ReplaceHeadOptions,
    *,
    optimizer: str | None,
    dry_run: bool,
    command: Command | None,
) -> Change:
    target, root_name, root = names.one_module(
        session.workspace, None if where == "auto" else where, optimizer, acting_on=_old_heads
    )
    num_classes, labels = given.num_classes, given.labels
    if num_classes is None:
        known = labels if labels is not None else session.class_names.given(target.model)
        if known is None:
            raise TorchMagicError(
                "the class count is missing: give num_classes (or labels, or load the "
                "data first so that its class folders give them)",
                param="num_classes",
            )
        num_classes, labels = len(known), tuple(known)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise TorchMagicError(
            f"num_classes must be a positive integer, got {num_classes!r}",
            param="num_classes",
        )
    options = replace(given, num_classes=num_classes, labels=labels)
    return run(
        session,
        "replace_head",
        command or call("replace_head", where or "auto", num_classes, dropout=given.dropout),
        target,
        lambda tx: _named_head(session, target, root, root_name, options, tx),
        dry_run=dry_run,
        replay=Replay("replace_head", (root_name,), given_fields(options)),
    )


def _old_heads(model: nn.Module, root_name: str, walked: ModelWalk) -> list[nn.Parameter]:
    """The parameters of the heads a replace_head at ``root_name`` replaces."""
    found = heads.locate(model, root_name or None, walked.modules)
    return unique_parameters([h.module for h in found])


def _named_head(
    session: Session,
    target: edits.BoundModel,
    root: nn.Module,
    root_name: str,
    options: ReplaceHeadOptions,
    tx: Transaction,
) -> Effect:
    """The new head, and the model's class names with it (none without ``labels``: the
    old names do not fit the new head); undo restores the previous names too."""
    effect = edits.replace_head(target, root, root_name, options, tx)
    session.class_names.give(target.model, options.labels, tx)
    return effect


def add_lora(
    session: Session,
    targets: Sequence[str | Sequence[str]],
    given: LoraOptions,
    *,
    optimizer: str | None,
    dry_run: bool,
    command: Command | None,
) -> Change:
    options = lora.check_options(given)
    if not targets:
        raise TorchMagicError("name the layers to adapt", param="targets")
    if options.lr is not None:
        options = replace(options, lr=check_positive(options.lr, "lr"))
    texts = [t if isinstance(t, str) else suffix_list(t) for t in targets]
    selected = names.selection(session.workspace, texts, (), optimizer, suffixes=True)
    target, selection = selected.target, selected.selection
    _refuse_lr_setter(session, target, options.lr is not None)
    later = (
        discovery.optimizers_to_come(session.workspace.items(), target.model)
        if target.optimizer is None
        else []
    )
    return run(
        session,
        "lora",
        command or call("lora", *texts, **dict(given_fields(options))),
        target,
        lambda tx: lora.add(target, selection, options, tx, later),
        dry_run=dry_run,
        replay=replay_of("lora", selected, options),
    )


def merge_lora(
    session: Session,
    model: str | None,
    optimizer: str | None,
    dry_run: bool,
    command: Command | None,
) -> Change:
    target = _lora_target(session, model, optimizer)
    return run(
        session,
        "merge_lora",
        command or call("merge_lora", model=model),
        target,
        lambda tx: lora.merge(target, tx),
        dry_run=dry_run,
        replay=Replay("merge_lora", (), ()),
    )


def switch_lora(session: Session, model: str | None, on: bool, command: Command | None) -> Change:
    """The LoRA adapters' contribution off (kept, not merged) or on again."""
    action = "lora_on" if on else "lora_off"
    command = command or call(action, model=model)
    target = _lora_target(session, model, None)
    return run(
        session,
        action,
        command,
        target,
        lambda tx: lora.switch(target, on, tx),
        replay=Replay(action, (), ()),
    )


def _lora_target(session: Session, model: str | None, optimizer: str | None) -> edits.BoundModel:
    target = session.bound(model, optimizer)
    model_checks.check_editable(target.model, target.model_name, target.walked)
    return target


def set_base_lrs(
    session: Session,
    lrs: Mapping[int, float],
    model: str | None,
    optimizer: str | None,
    command: Command | None,
) -> Change:
    target = session.bound(model, optimizer)
    lrs = dict(lrs)
    return run(
        session,
        "set_lr",
        command or call("set_base_lrs", lrs=lrs),
        target,
        lambda tx: set_group_base_lrs(target, lrs, tx),
        replay=Replay("set_base_lrs", (), (("lrs", tuple(sorted(lrs.items()))),)),
    )


def summary(
    session: Session, where: str | None, depth: int | None, input_shape: Sequence[int] | None
) -> SummaryReport:
    if depth is not None and depth < 0:
        raise TorchMagicError(f"depth must be >= 0, got {depth}", param="depth")
    target, relative_name, root = names.one_module(session.workspace, where, reading=True)
    label = f"{target.model_name}.{relative_name}" if relative_name else target.model_name
    config = session.config
    return summarize(
        root,
        model_name=label,
        optimizer=target.optimizer,
        optimizer_name=target.optimizer_name,
        schedulers=target.schedulers,
        scheduler_names=target.names,
        depth=config.summary_depth if depth is None else depth,
        max_rows=config.summary_max_rows,
        input_shape=input_shape,
    )


# -- checks and records ------------------------------------------------------------------


def checked_bn(policy: str) -> str:
    if policy not in POLICIES:
        raise TorchMagicError(f"bn={policy!r}: choose one of {', '.join(POLICIES)}", param="bn")
    return policy


def _checked_lr(lr: LrSpec) -> LrSpec:
    if lr is None:
        return None
    if isinstance(lr, tuple):
        if len(lr) != 2:
            raise TorchMagicError(
                f"lr must be a number or a (first, last) pair, got {lr}", param="lr"
            )
        first, last = lr
        return (check_positive(first, "lr"), check_positive(last, "lr"))
    return check_positive(lr, "lr")


def call(action: str, *args: str | int, **kwargs: object) -> Advice:
    """The command as the session call that did it, for the history; each front end
    spells it (``tm.freeze("layer1")``, ``%freeze layer1``)."""
    given = tuple((key, value) for key, value in kwargs.items() if value is not None)
    return (Call(action, args, given),)


def replay_of(
    method: str, selected: names.Selected, given: FreezeOptions | UnfreezeOptions | LoraOptions
) -> Replay:
    """``method``'s call on the targets as they were resolved, relative to their model,
    with the options that say something (an exclusion, relative too, last)."""
    keywords = given_fields(given, leave_out=("exclude",))
    if selected.excluded:
        keywords = (*keywords, ("exclude", selected.excluded))
    return Replay(method, selected.relative, keywords)
