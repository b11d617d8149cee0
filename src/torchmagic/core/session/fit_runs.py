"""The Session's training: the plan a run trains by (refused before anything changes),
fit's pacing hooks (progressive unfreezing through the session's own ``unfreeze``) and its
record for export, the lr range test and applying its suggestion, fine_tune's phases as the
session's own commands, and the one correct optimizer step of a hand-written loop."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..advice import Option
from ..choices import SCHEDULES
from ..errors import TorchMagicError
from ..evaluation import metrics as evaluation_metrics
from ..export import InferenceReport
from ..modules import unwrap
from ..numbers import short
from ..options import FineTuneOptions, FitOptions, LrFindOptions, changed_fields
from ..surgery import edits, heads, scheduler_sync
from ..surgery.base_lrs import base_lrs
from ..surgery.results import Replay
from ..training.amp import Accumulation
from ..training.counts import check_ceiling
from ..training.fit import fit as run_fit
from ..training.fit_events import FitHistory, FitObserver, StopReason, report_progress
from ..training.fit_plan import FitPlan, check_plan, input_shape, resolve_loss
from ..training.lr_find import LrFindResult, check_range, find_lr
from ..training.progressive import BUILT_IN_MONITORS, Pacing, check_pacing
from ..training.recipe import (
    HEAD_PHASE,
    UNFROZEN_PHASE,
    FineTuneResult,
    OneCyclePhase,
    fine_tune_blocks,
    one_cycle_phase,
)
from . import names, save_load, shared
from .commands import call, checked_bn
from .hardware import check_placement

if TYPE_CHECKING:
    from ..workspace import Workspace
    from .facade import Session


# Runs that end fine_tune's recipe early and export nothing: Ctrl-C, a non-finite loss.
BROKEN_OFF = (StopReason.INTERRUPTED, StopReason.NON_FINITE_LOSS)


def fit_plan(
    session: Session,
    train: object,
    *,
    model: str | None,
    val: object | None,
    loss: str | Callable,
    optimizer: str | None,
    label: str,
) -> tuple[edits.BoundModel, FitPlan]:
    """The bound model and a plan to train it: its optimizer and schedulers, the
    session's device, AMP policy and the loss. Refuses before anything changes."""
    workspace = session.workspace
    _check_model_word(workspace, model, takes_val=label != "lr_find")
    name, module = workspace.resolve_model(model)
    target = names.bind(workspace, name, module, optimizer, False)
    shared.join(session, target.model, name)  # the fit holds the lock of the model's history
    if target.optimizer is None:
        stale = workspace.stale_optimizers()
        left_over = (
            f" ({', '.join(repr(n) for n in stale)} "
            f"{'holds' if len(stale) == 1 else 'hold'} the parameters of a model no "
            f"variable names any more: was '{name}' re-created after it?)"
            if stale
            else ""
        )
        raise TorchMagicError(
            f"no optimizer holds the parameters of '{name}'{left_over}; create one, e.g. "
            f"optimizer = torch.optim.AdamW(p for p in {name}.parameters() "
            "if p.requires_grad)"
        )
    device = check_placement(session, name, target.model)
    amp = session.amp
    plan = FitPlan(
        model=target.model,
        model_name=name,
        optimizer=target.optimizer,
        schedulers=scheduler_sync.roots(target.schedulers) + list(session._phase_schedulers),
        loss_fn=resolve_loss(loss, workspace.namespace),
        device=device,
        amp=amp,
        train=names.loader(workspace, train, "train"),
        val=None if val is None else names.loader(workspace, val, "val"),
        label=label,
    )
    return target, plan


def _check_model_word(workspace: Workspace, model: str | None, takes_val: bool) -> None:
    """A loader named where the model goes (``val_loader, train_loader``) is refused with
    the order the arguments take, not as a DataLoader that is not a module."""
    if model is None or workspace.module(model) is not None:
        return
    found = workspace.lookup(model)
    if found is None or not isinstance(found.held, Iterable):
        return
    val = ("; a validation loader goes in ", Option("val", "LOADER")) if takes_val else ()
    raise TorchMagicError(
        (
            f"'{model}' is a {type(found.held).__name__}, not a model: the model comes first "
            "(none: the current one), then the training loader",
            *val,
        ),
        param="model",
    )


def fit(
    session: Session,
    train: object,
    options: FitOptions,
    *,
    model: str | None,
    val: object | None,
    optimizer: str | None,
    observer: FitObserver | None,
) -> FitHistory:
    target, plan = fit_plan(
        session,
        train,
        model=model,
        val=val,
        loss=options.loss,
        optimizer=optimizer,
        label=f"fit {len(session.fits) + 1}",
    )
    plan.epochs, plan.max_steps = options.epochs, options.max_steps
    plan.cache_features, plan.sched_step = options.cache_features, options.sched_step
    plan.accumulate, plan.clip = options.accumulate, options.clip
    measured = run_metrics(options.metric, options.monitor)
    _check_metrics(target.model, measured, plan.val is not None)
    plan.metrics = evaluation_metrics.factories(measured)
    shape = _export_shape(session, plan, options.export, target.model_name)
    unfreeze = options.unfreeze
    blocks = unfreeze.split(",") if isinstance(unfreeze, str) else list(unfreeze)
    blocks = [b.strip() for b in blocks if b.strip()]
    pacing = Pacing(
        tuple(blocks),
        options.every,
        options.patience,
        options.lr_ratio,
        options.monitor,
        options.early_stop,
        options.keep_best,
        _rising(options.monitor),
    )
    if (
        blocks
        or pacing.every is not None
        or pacing.patience is not None
        or pacing.early_stop
        or pacing.keep_best
    ):
        plan.pacing = _pacing(session, target, plan, pacing, optimizer)
    elif options.monitor != "loss":
        check_pacing(
            Pacing(monitor=options.monitor), plan.val is not None, options.cache_features, measured
        )
    if observer is not None:
        plan.observer = observer
    before = _newest_command(session, target.model)
    history = run_fit(plan)
    if options.export is not None:
        history = _exported(session, history, options.export, shape)
    session.fits.append(history)
    workspace = session.workspace
    workspace.current = target.model_name
    recorded = replace(
        options,
        loss=_named_loss(options.loss),
        unfreeze=tuple(blocks),
        lr_ratio=options.lr_ratio if plan.pacing is not None else FitOptions.lr_ratio,
        metric=measured,
    )
    record = Replay(
        "fit",
        (),
        (
            *_loaders(workspace, train, val),
            ("epochs", options.epochs),
            *changed_fields(recorded, leave_out=("epochs",)),
        ),
    )
    record_call(session, target.model, record, before)
    return history


def run_metrics(metric: Sequence[str] | str, monitor: str) -> tuple[str, ...]:
    """The metrics a run measures: those named, and the monitored one when it is a
    metric (``f1``) rather than the loss or ``acc``; unknown names refused in one line."""
    measured = evaluation_metrics.metric_names(metric)
    if monitor in BUILT_IN_MONITORS or monitor in measured:
        return measured
    if not isinstance(monitor, str) or monitor not in evaluation_metrics.METRICS:
        known = (*BUILT_IN_MONITORS, *evaluation_metrics.METRICS)
        raise TorchMagicError(
            f"monitor must be one of {', '.join(known)}, got {monitor!r}"
            + evaluation_metrics.did_you_mean(monitor, known),
            param="monitor",
        )
    return (*measured, monitor)


def _rising(monitor: str) -> bool | None:
    """Whether a larger value of a monitored metric is better (None: the loss or acc)."""
    if monitor in BUILT_IN_MONITORS:
        return None
    return evaluation_metrics.higher_is_better(monitor)


def _check_metrics(model: nn.Module, measured: tuple[str, ...], has_val: bool) -> None:
    """Metrics need validation data, and top-k accuracy at least k classes where the
    model's head tells how many it has."""
    if not measured:
        return
    if not has_val:
        raise TorchMagicError(
            (
                f"metric {','.join(measured)} is measured on the validation data: give ",
                Option("val", "LOADER"),
            ),
            param="metric",
        )
    try:
        classes = getattr(heads.find_head(unwrap(model)).module, "out_features", None)
    except TorchMagicError:
        return
    for name in measured:
        k = evaluation_metrics.top_k(name)
        if isinstance(classes, int) and k > classes:
            raise TorchMagicError(
                f"metric {name} needs at least {k} classes; the head of the model has {classes}",
                param="metric",
            )


def _export_shape(
    session: Session, plan: FitPlan, path: str | None, model_name: str
) -> tuple[int, ...] | None:
    """The input shape an export after the run traces with (None without ``path``); the
    export is refused now, before any training, when it could not be written."""
    if path is None:
        return None
    shape = input_shape(plan.val if plan.val is not None else plan.train)
    save_load.check_inference_export(session, path, model_name, shape)
    return shape


def _exported(
    session: Session, history: FitHistory, path: str, shape: tuple[int, ...] | None
) -> FitHistory:
    """The run's history with the weights the model holds now (the best epoch's with
    keep_best) exported for inference to ``path`` (replaced), or why not: a run stopped
    by Ctrl-C or a non-finite loss exports nothing, and a refused export leaves the run
    as it is."""
    if history.stop_reason in BROKEN_OFF:
        stopped = (
            "the run was interrupted"
            if history.stop_reason is StopReason.INTERRUPTED
            else "the loss was not finite"
        )
        return replace(history, not_exported=f"nothing exported to {path}: {stopped}")
    try:
        report = session.export(path, history.model_name, force=True, input_shape=shape)
    except TorchMagicError as error:
        return replace(history, not_exported=f"nothing exported to {path}: {error}")
    assert isinstance(report, InferenceReport)
    return replace(history, exported=report)


def _named_loss(loss: str | Callable) -> str | Callable:
    """A loss as a replay can name it: a name other than the default, else the default
    (a function cannot be written into a script; it is left out)."""
    return loss if isinstance(loss, str) else FitOptions.loss


def _loaders(
    workspace: Workspace, train: object, val: object | None
) -> tuple[tuple[str, object], ...]:
    """A run's loaders as a replay names them: the variables holding them."""
    named = (("train", names.name_of(workspace, train, "train_loader")),)
    if val is None:
        return named
    return (*named, ("val", names.name_of(workspace, val, "val_loader")))


def record_call(
    session: Session, model: nn.Module | None, call: Replay, before: int | None = None
) -> None:
    """``call`` (a fit, a fine_tune, an AMP switch: ``model`` None) for export, between
    the newest command before it and the newest after it (what it made itself)."""
    newest = _newest_command(session, model)
    ref = None if model is None else weakref.ref(model)
    session._fit_calls.append((ref, newest if before is None else before, newest, call))


def _newest_command(session: Session, model: nn.Module | None) -> int:
    """The index of the newest command on ``model`` (None: on any model), 0 if none."""
    applied = session.history() if model is None else session._history.applied(model)
    return max((e.index for e in applied), default=0)


def _head_base_lr(target: edits.BoundModel) -> float:
    """The base lr of the group training the head (now)."""
    ref = edits.head_group(target)
    return base_lrs(target.optimizer, target.schedulers)[0 if ref is None else ref]  # type: ignore[arg-type]


def _pacing(
    session: Session,
    target: edits.BoundModel,
    plan: FitPlan,
    pacing: Pacing,
    optimizer: str | None,
) -> Pacing:
    """``pacing`` with the session's hooks, after checking every block: it names
    modules of the model, holds frozen parameters no earlier block takes, and a dry
    run of its unfreeze passes (schedulers followable…)."""
    measured = tuple(metric for metric, _ in plan.metrics)
    check_pacing(pacing, plan.val is not None, plan.cache_features, measured)
    name = target.model_name

    def head_base_lr() -> float:
        return _head_base_lr(names.bind(session.workspace, name, target.model, optimizer, False))

    def unfreeze_block(block: str, lr: float, epoch: int) -> None:
        session.unfreeze(
            name,
            block,
            lr=lr,
            optimizer=optimizer,
            command=(
                *call("unfreeze", f"{name}.{block}", lr=lr),
                f" ({plan.label}, after epoch {epoch})",
            ),
        )

    claimed: set[int] = set()
    first_lr = head_base_lr() * pacing.lr_ratio if pacing.blocks else 0.0
    for block in pacing.blocks:
        selection = names.selection(session.workspace, (name, block), (), optimizer).selection
        frozen = [p for p in selection.parameters() if not p.requires_grad and id(p) not in claimed]
        if not frozen:
            raise TorchMagicError(
                f"'{block}' has no frozen parameters left to unfreeze", param="unfreeze"
            )
        claimed.update(id(p) for p in frozen)
        session.unfreeze(name, block, lr=first_lr, optimizer=optimizer, dry_run=True)
    return replace(pacing, unfreeze=unfreeze_block, head_base_lr=head_base_lr)


def lr_find(
    session: Session,
    train: object,
    options: LrFindOptions,
    *,
    model: str | None,
    optimizer: str | None,
    observer: FitObserver | None,
) -> LrFindResult:
    start, end, steps = options.start, options.end, options.steps
    check_range(start, end, steps)
    target, plan = fit_plan(
        session,
        train,
        model=model,
        val=None,
        loss=options.loss,
        optimizer=optimizer,
        label="lr_find",
    )
    if observer is not None:
        plan.observer = observer
    assert target.optimizer is not None
    bases = base_lrs(target.optimizer, target.schedulers)
    ref = edits.head_group(target)
    ref = 0 if ref is None else ref
    result = find_lr(plan, start=start, end=end, steps=steps, reference=ref, bases=bases)
    if not options.apply or result.suggestion is None:
        return result
    suggestion = result.suggestion
    new = {
        i: suggestion * r
        for i, (b, r) in enumerate(zip(bases, result.ratios, strict=True))
        if b > 0
    }
    group = result.reference_name
    change = session.set_base_lrs(
        new,
        model=target.model_name,
        optimizer=optimizer,
        command=(
            *call("lr_find", apply=True),
            f": base lr {short(suggestion)} for {'group ' * group.isdigit()}{group}, "
            "others in proportion",
        ),
    )
    return replace(result, applied=change)


def fine_tune(
    session: Session,
    train: object,
    options: FineTuneOptions,
    *,
    val: object,
    model: str | None,
    optimizer: str | None,
    observer: FitObserver | None,
) -> FineTuneResult:
    epochs, freeze_epochs, lr = options.epochs, options.freeze_epochs, options.lr
    bn, schedule = options.bn, options.schedule
    for what, value in (("epochs", epochs), ("freeze_epochs", freeze_epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TorchMagicError(f"{what} must be at least 1, got {value!r}", param=what)
        check_ceiling(value, what)
    if lr is not None and not (
        isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < float("inf")
    ):
        raise TorchMagicError(f"lr must be a positive number, got {lr!r}", param="lr")
    if bn is not None:
        checked_bn(bn)
    target, plan = fit_plan(
        session, train, model=model, val=val, loss=options.loss, optimizer=optimizer, label=""
    )
    plan.accumulate, plan.clip = options.accumulate, options.clip
    check_plan(plan)
    measured = run_metrics(options.metric, options.monitor)
    _check_metrics(target.model, measured, plan.val is not None)
    if options.keep_best or options.monitor != FineTuneOptions.monitor:
        check_pacing(
            Pacing(monitor=options.monitor, keep_best=options.keep_best),
            plan.val is not None,
            False,
            measured,
        )
    shape = _export_shape(session, plan, options.export, target.model_name)
    steps_per_epoch = _one_cycle_steps(schedule, target, plan)
    name = target.model_name
    head = heads.find_head(target.model).name
    blocks = fine_tune_blocks(target.model)
    if not head or not blocks:
        raise TorchMagicError(
            f"'{name}' is a single layer: there is no body to fine-tune", param="model"
        )
    run = FitOptions(
        loss=options.loss,
        sched_step=options.sched_step,
        accumulate=options.accumulate,
        clip=options.clip,
        metric=measured,
    )
    opt = target.optimizer
    assert opt is not None
    before, fits_before = _newest_command(session, target.model), len(session._fit_calls)
    freeze = session.freeze(name, exclude=(head,), bn=bn, optimizer=optimizer)
    report_progress(observer, freeze)
    with _phase(session, opt, HEAD_PHASE, freeze_epochs * steps_per_epoch):
        head_fit = session.fit(
            train,
            model=name,
            val=val,
            options=replace(run, epochs=freeze_epochs),
            optimizer=optimizer,
            observer=observer,
        )
    if options.export is not None and head_fit.stop_reason in BROKEN_OFF:
        head_fit = _exported(session, head_fit, options.export, shape)
        session.fits[-1] = head_fit
    result = FineTuneResult(name, 0.0, blocks, freeze, head_fit, schedule=schedule, bn=bn)
    if head_fit.stop_reason in BROKEN_OFF:
        return result
    top = (
        lr
        if lr is not None
        else _head_base_lr(names.bind(session.workspace, name, target.model, optimizer, False))
    )
    unfreeze = session.unfreeze(name, *blocks, lr=(top / 100, top), optimizer=optimizer)
    report_progress(observer, unfreeze)
    with _phase(session, opt, UNFROZEN_PHASE, epochs * steps_per_epoch):
        full_fit = session.fit(
            train,
            model=name,
            val=val,
            options=replace(
                run,
                epochs=epochs,
                monitor=options.monitor,
                keep_best=options.keep_best,
                export=options.export,
            ),
            optimizer=optimizer,
            observer=observer,
        )
    # the whole recipe ran: export it as one call, not as its four commands
    del session._fit_calls[fits_before:]
    recorded = replace(options, loss=_named_loss(options.loss), metric=measured)
    record = Replay(
        "fine_tune",
        (),
        (
            *_loaders(session.workspace, train, val),
            ("epochs", epochs),
            *changed_fields(recorded, leave_out=("epochs",)),
        ),
    )
    record_call(session, target.model, record, before)
    return replace(result, lr=top, unfreeze=unfreeze, full_fit=full_fit)


def _one_cycle_steps(schedule: str | None, target: edits.BoundModel, plan: FitPlan) -> int:
    """Optimizer steps per epoch for ``schedule="one-cycle"`` (0 without a schedule);
    refuses a schedule it cannot run."""
    if schedule is None:
        return 0
    if schedule not in SCHEDULES:
        raise TorchMagicError(
            f"schedule={schedule!r}: choose {' or '.join(SCHEDULES)} (or None)",
            param="schedule",
        )
    if plan.schedulers:
        bound = ", ".join(type(s).__name__ for s in plan.schedulers)
        raise TorchMagicError(
            f"schedule={schedule!r} gives each phase its own OneCycleLR, but the "
            f"optimizer of '{target.model_name}' is already scheduled by {bound}: "
            "unbind it (del the variable) or leave schedule out",
            param="schedule",
        )
    batches = len(plan.train) if isinstance(plan.train, Sized) else None
    if not batches:
        raise TorchMagicError(
            f"schedule={schedule!r} needs the number of batches per epoch: train has no len()",
            param="schedule",
        )
    return math.ceil(batches / plan.accumulate)


@contextmanager
def _phase(
    session: Session, optimizer: torch.optim.Optimizer, phase: OneCyclePhase, total_steps: int
) -> Iterator[None]:
    """fine_tune's run under its own OneCycleLR (``total_steps`` 0: no schedule)."""
    if not total_steps:
        yield
        return
    with one_cycle_phase(optimizer, phase, total_steps) as scheduler:
        session._phase_schedulers = (scheduler,)
        try:
            yield
        finally:
            session._phase_schedulers = ()


def step(
    session: Session,
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    accumulate: int,
    clip: float | None,
    last: bool,
) -> bool:
    window = session._windows.get(optimizer)
    if window is None or (window.every, window.clip) != (accumulate, clip):
        fresh = Accumulation(accumulate, clip)  # checks both
        if window is not None and window.pending:
            raise TorchMagicError(
                f"{window.pending} of {window.every} batches of this optimizer's window "
                f"are accumulated with accumulate={window.every}, clip={window.clip}: "
                "finish it (last=True) before changing them",
                param="accumulate",
            )
        window = session._windows[optimizer] = fresh
    return window.add(loss, optimizer, session.amp.active_scaler, last=last)
