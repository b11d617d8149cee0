"""The Session's mutating commands and how each one runs: validated first, then applied in
a transaction, recorded in the history (the commit point) and settled, or not at all, also
under Ctrl-C. Each command keeps the call that makes it again on a freshly built model (its
replay record: what a checkpoint and an exported script hold)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .. import distributed
from ..advice import Advice, Call, Command
from ..choices import POLICIES
from ..errors import TorchMagicError
from ..integrations import discovery
from ..options import (
    FreezeOptions,
    LoraOptions,
    ReplaceHeadOptions,
    UnfreezeOptions,
    given_fields,
)
from ..surgery import edits, lora, model_checks
from ..surgery.base_lrs import set_base_lrs as set_group_base_lrs
from ..surgery.counting import describe_groups, group_keys
from ..surgery.grammar import (
    LrSpec,
    Target,
    check_positive,
    parse_targets,
    spread_lrs,
    suffix_list,
)
from ..surgery.results import Change, Effect, Replay, SummaryReport
from ..surgery.summary import summarize
from ..surgery.transaction import Transaction, uninterrupted
from ..workspace import Workspace
from . import invariants, names, shared, undo

if TYPE_CHECKING:
    from .facade import Session


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

    def apply(tx: Transaction, before: edits.Measured) -> tuple[Change, edits.Measured]:
        groups_before = group_keys(target.optimizer)
        effect = step(tx)
        after = edits.measure(target)
        opt = target.optimizer
        if opt is not None and len(opt.param_groups) != len(groups_before):
            effect = replace(effect, notes=(*effect.notes, *discovery.resume_notes(found, opt)))
        # what may undo or override this change on its own, named when it changed something
        told = tuple(h.line for h in target.holders) if after.state != before.state else ()
        return Change(
            action=action,
            command=command,
            model_name=target.model_name,
            effect=replace(
                effect,
                notes=effect.notes + tuple(n for n in (*notes, *told) if n not in effect.notes),
            ),
            before=before.counts,
            after=after.counts,
            optimizer_name=target.optimizer_name,
            groups=describe_groups(
                target.optimizer, groups_before, target.schedulers, target.names
            ),
            dry_run=dry_run,
            unchanged=after.state == before.state,
        ), after

    change, dropped = uninterrupted(lambda: _atomically(session, target, apply, dry_run, replay))
    if dropped:
        told = (*change.effect.notes, undo.dropped(session, dropped))
        change = replace(change, effect=replace(change.effect, notes=told))
    return change


def _atomically(
    session: Session,
    target: edits.BoundModel,
    apply: Callable[[Transaction, edits.Measured], tuple[Change, edits.Measured]],
    dry_run: bool,
    replay: Replay | None = None,
) -> tuple[Change, int]:
    """``apply`` in a transaction, checked (the post-condition), then recorded (the
    commit point) and settled; or rolled back. ``apply`` gets the model measured before
    and returns it measured after: one walk each for the counts, the state and the
    invariants. Returns the change and how many old records the history dropped."""
    tx = Transaction()
    measured = edits.measure(target)
    before = invariants.observe(target, measured.parameters)
    try:
        change, after = apply(tx, measured)
        if dry_run or change.unchanged:  # nothing to keep: no history entry to undo
            tx.revert()
            return change, 0
        invariants.check(target, before, change.command, parameters=after.parameters)
        dropped = session._history.push(
            change,
            target.model,
            target.optimizer,
            tx,
            session.config.history_limit,
            session.history_cap().nbytes,
            replay,
            before,
            session.workspace,
        )
        _settle(session, target, tx)
        return change, dropped
    except BaseException:
        # recorded means applied: finish it; otherwise it never happened
        if session._history.holds(tx):
            _settle(session, target, tx)
        else:
            tx.revert()
        raise


def _settle(session: Session, target: edits.BoundModel, tx: Transaction) -> None:
    """What follows a command's commit point; idempotent, so an interrupted one is
    simply run again."""
    tx.commit()
    session.workspace.current = target.model_name
    if target.optimizer_name is not None:
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
    target, selection = names.selection(session.workspace, targets, options.exclude, optimizer)
    return run(
        session,
        "freeze",
        command or call("freeze", *targets, **dict(given_fields(given))),
        target,
        lambda tx: edits.freeze(target, selection, policy, tx),
        dry_run=dry_run,
        replay=replay_of(session.workspace, "freeze", targets, options),
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
    target, selection = names.selection(session.workspace, targets, options.exclude, optimizer)
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
        lambda tx: edits.unfreeze(target, selection, lrs, options.wd, ratio, tx, later),
        dry_run=dry_run,
        replay=replay_of(session.workspace, "unfreeze", targets, options),
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
    num_classes = given.num_classes
    if num_classes is None:
        if given.labels is None:
            raise TorchMagicError(
                "the class count is missing: give num_classes (or labels)",
                param="num_classes",
            )
        num_classes = len(given.labels)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise TorchMagicError(
            f"num_classes must be a positive integer, got {num_classes!r}",
            param="num_classes",
        )
    options = replace(given, num_classes=num_classes)
    target, root_name, root = names.one_module(
        session.workspace, None if where == "auto" else where, optimizer
    )
    return run(
        session,
        "replace_head",
        command or call("replace_head", where or "auto", num_classes, dropout=given.dropout),
        target,
        lambda tx: edits.replace_head(target, root, root_name, options, tx),
        dry_run=dry_run,
        replay=Replay("replace_head", (root_name,), given_fields(options)),
    )


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
    target, selection = names.selection(session.workspace, texts, (), optimizer, suffixes=True)
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
        replay=replay_of(session.workspace, "lora", texts, options),
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
    model_checks.check_editable(target.model, target.model_name)
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


def options(**given: object) -> tuple[tuple[str, object], ...]:
    """Keyword arguments of a replay, those left at None dropped."""
    return tuple((k, v) for k, v in given.items() if v is not None)


def replay_of(
    workspace: Workspace,
    method: str,
    targets: Sequence[str],
    given: FreezeOptions | UnfreezeOptions | LoraOptions,
) -> Replay:
    """``method``'s call with its targets (and those it excludes) relative to the model
    they name, so that it replays on the same model under any variable name."""
    name, _, relative = workspace.split_root(parse_targets(targets))
    keywords = given_fields(given, leave_out=("exclude",))
    exclude = getattr(given, "exclude", ())
    excluded = [workspace.relative_to(name, t) for t in parse_targets(exclude)]
    if excluded:
        keywords = (*keywords, ("exclude", tuple(_relative_text(t) for t in excluded)))
    return Replay(method, tuple(_relative_text(t) for t in relative), keywords)


def _relative_text(target: Target) -> str:
    """A target relative to its model, as text the grammar parses again ("" : the model)."""
    if target.glob is not None:
        return target.glob
    if target.suffixes:
        return suffix_list(target.suffixes)
    return ".".join(segment.text for segment in target.segments)
