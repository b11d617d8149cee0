"""The Session leaving the kernel: a save file of the (current) model, loading one by
replaying its saved calls through the session's own commands (all or nothing), and the
model's commands, fits included, exported as a script of Session calls (or the model for
inference, by the path's suffix). The file format is ``core.checkpoint``'s, the exports'
``core.export``'s."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from ...version import __version__
from .. import checkpoint as checkpoint_file
from .. import sharding
from ..advice import spelled
from ..checkpoint import ResumeReport, SaveReport
from ..checkpoint.provenance import zoo_call
from ..errors import TorchMagicError
from ..export import (
    ExportOptions,
    ExportReport,
    InferenceReport,
    files,
    formats,
    inference,
    metadata,
)
from ..export.script import python_call
from ..export.script import script as write_script
from ..export.script import write as write_text
from ..modules import unwrap
from ..rng import capture_rng, restore_rng
from ..surgery import edits, scheduler_sync
from ..surgery.grammar import parse_target
from ..surgery.results import Replay
from ..surgery.transaction import uninterrupted
from ..training.fit_plan import LOSSES
from . import fsdp, names, replay

if TYPE_CHECKING:
    from .facade import Session


def save(session: Session, path: str | os.PathLike, model: str | None, sync: bool) -> SaveReport:
    target = session.bound(model)
    fsdp.refuse_sharded_save(session, target, os.fspath(path))
    applied = session._history.applied(target.model)
    built_by = zoo_call(session.loaded.get(target.model_name), target.model)
    payload = checkpoint_file.capture(
        target, applied, session.amp, python_call, __version__, built_by
    )
    nbytes = checkpoint_file.write(payload, path, sync=sync)
    return checkpoint_file.summarize_save(
        payload, os.fspath(path), nbytes, synced=sync, commands=[e.command for e in applied]
    )


def load(
    session: Session,
    path: str | os.PathLike,
    model: str | None,
    optimizer: str | None,
    scaler: torch.amp.GradScaler | None,
) -> ResumeReport:
    where = os.fspath(path)
    payload = checkpoint_file.read(where)
    target = session.bound(model, optimizer)
    fsdp.refuse_sharded_resume(session, target, where)
    device_type = session.model_device(target.model).type
    calls = list(checkpoint_file.replays(payload))
    history = session._history
    already = len(history.applied(target.model))
    checkpoint_file.check_fresh(payload, where, target, device_type, already)
    roots = scheduler_sync.roots(target.schedulers)
    schedules = [copy.deepcopy(s.state_dict()) for s in roots]  # type: ignore[attr-defined]
    generators = capture_rng()  # a replayed head draws its initial weights
    before = Before(
        history.next_index(), len(history.undone), session.workspace.current, history.seals
    )
    try:
        history.keep_all = True  # every replayed record kept, so that a failure undoes each
        replay.replay(
            session,
            target,
            payload["history"],
            calls,
            lambda call, command: _replay_call(session, target, call, command),
        )
        checkpoint_file.check_replayed(payload, where, target)
        uninterrupted(lambda: _load_all(session, payload, target, device_type, scaler))
        _finish(session, len(calls))
    except BaseException as exc:  # a refusal, a bug or Ctrl-C
        if history.seals > before.seals:  # the load completed: it ends so, nothing undone
            uninterrupted(lambda: _finish(session, len(calls)))
            raise
        replayed = history.next_index() - before.first  # records: one per call run
        uninterrupted(
            lambda: _roll_back(
                session, before, dict(zip(roots, schedules, strict=True)), generators
            )
        )
        if not isinstance(exc, TorchMagicError) or str(exc).startswith("cannot resume"):
            raise
        failed = calls[replayed][0] if replayed < len(calls) else "the load"
        raise TorchMagicError(
            f"cannot resume from '{where}': replaying {failed} failed: {exc}; nothing was changed"
        ) from None
    finally:
        history.keep_all = False
    return checkpoint_file.summarize_resume(payload, where, target)


class Before(NamedTuple):
    """What a load puts back when it fails: the first index its records take, how many
    commands were listed as undone, the current model; and how many loads were sealed
    (one more: this one completed)."""

    first: int
    undone: int
    current: str | None
    seals: int


def _roll_back(session: Session, before: Before, schedules: dict, generators: dict) -> None:
    """Undo what a failed load replayed, newest first (copied records are taken out),
    and put back the schedulers' states (their per-group lists too) and the RNG."""
    history = session._history
    while history.newest_index() >= before.first:
        if not history.drop_copy():
            session.undo()
    del history.undone[before.undone :]
    session.workspace.current = before.current
    for scheduler, schedule in schedules.items():
        scheduler.load_state_dict(schedule)
    restore_rng(generators)


def _load_all(
    session: Session,
    payload: dict,
    target: edits.BoundModel,
    device_type: str,
    scaler: torch.amp.GradScaler | None,
) -> None:
    """Every state, the guard, then the seal, all or nothing (Ctrl-C held): a failure
    before the seal is counted puts the states back and the caller undoes the replay;
    once it is counted, the load is complete."""
    history = session._history
    sealed = history.seals
    put_back: Callable[[], None] | None = None
    try:
        put_back = checkpoint_file.keep_states(target, session.amp, scaler)
        checkpoint_file.load_states(payload, target)
        checkpoint_file.load_precision(payload, session.amp, device_type, scaler)
        checkpoint_file.load_rng(payload)
        sharding.guard_unsharded_steps(target.model, target.optimizer)
        session.workspace.current = target.model_name
        history.seal_replayed(len(payload["history"]))  # the commit point
    except BaseException:
        if history.seals == sealed and put_back is not None:
            put_back()
        raise


def _finish(session: Session, count: int) -> None:
    """After a load's commit point (again if interrupted): its ``count`` records sealed,
    and the history back within its limits."""
    history = session._history
    history.sealed(count)
    history.keep_all = False
    history.trim(session.config.history_limit, session.history_cap().nbytes)


def _replay_call(session: Session, target: edits.BoundModel, call: Replay, command: str) -> None:
    """One saved command, on ``target`` whatever its variable is called."""
    name, opt = target.model_name, target.optimizer_name
    options = call.kwargs()

    def on_model(paths: Sequence[str]) -> list[str]:
        return [f"{name}.{p}" if p else name for p in paths] or [name]

    if call.method == "set_base_lrs":
        lrs = dict(options["lrs"])
        session.set_base_lrs(lrs, model=name, optimizer=opt, command=command)
    elif call.method == "lora":
        # peft's name endings are relative to the model the first target names
        texts = [p if p and parse_target(p).suffixes else on_model([p])[0] for p in call.targets]
        session.lora(name, *texts, optimizer=opt, command=command, **options)
    elif call.method == "merge_lora":
        session.merge_lora(name, optimizer=opt, command=command)
    elif call.method in ("lora_off", "lora_on"):
        getattr(session, call.method)(name, command=command)
    elif call.method == "replace_head":
        root = call.targets[0] if call.targets else ""
        labels = options.get("labels")
        session.replace_head(
            f"{name}.{root}" if root else name,
            options["num_classes"],
            dropout=options.get("dropout"),
            labels=None if labels is None else list(labels),
            optimizer=opt,
            command=command,
        )
    else:
        exclude = [f"{name}.{p}" for p in options.pop("exclude", ())]
        method = session.freeze if call.method == "freeze" else session.unfreeze
        method(*on_model(call.targets), exclude=exclude, optimizer=opt, command=command, **options)


def _suffix(path: str | os.PathLike) -> str:
    return os.path.splitext(os.fspath(path))[1].lower()


def check_inference_export(
    session: Session, path: object, model: str | None, input_shape: tuple[int, ...] | None
) -> None:
    """Refuse, before a run (``fit(export=...)``), an inference export it could not write
    after: a suffix other than an inference format's, a missing folder, a format whose
    packages are missing, a model whose input cannot be told (``input_shape``: one
    batch's, from the run's data). The file is replaced."""
    if not isinstance(path, (str, os.PathLike)) or _suffix(path) not in formats.FORMATS:
        raise TorchMagicError(
            f"export={path!r} must end in one of {', '.join(formats.FORMATS)} (the model "
            "for inference)",
            param="export",
        )
    target = session.bound(model, reading=True)
    try:
        files.destination(path, force=True)
        loaded = session.loaded.get(target.model_name)
        options = ExportOptions(input_shape=input_shape)
        inference.check_export(target.model, target.model_name, loaded, _suffix(path), options)
    except TorchMagicError as error:
        if error.param != "input_shape":
            raise TorchMagicError(error.advice, param="export") from None
        raise TorchMagicError(
            f"cannot tell what input '{target.model_name}' takes, so an export could not be "
            "checked: leave export out and export after the run, giving one batch's shape",
            param="export",
        ) from None


def export(
    session: Session, path: str | os.PathLike, model: str | None, options: ExportOptions
) -> ExportReport | InferenceReport:
    where, suffix = files.destination(path, options.force)
    target = session.bound(model, reading=True)
    if suffix != ".py":
        loaded = session.loaded.get(target.model_name)
        given = session.class_names.given(unwrap(target.model))
        built = session.pipelines.get(unwrap(target.model))  # load_data's, at its size
        return inference.export(
            target.model,
            target.model_name,
            loaded,
            where,
            suffix,
            options,
            labels=given,
            preprocessing=None if built is None else metadata.of_pipelines(built),
        )
    applied = session._history.applied(target.model)
    fits = [f for f in session._fit_calls if f[0] is None or f[0]() is target.model]
    made_by_fits = {
        e.index for e in applied for _, before, after, _ in fits if before < e.index <= after
    }
    steps: list[tuple[tuple[int, int], str, str]] = [
        ((e.index, 0), python_call(e.replay), spelled(e.command))
        for e in applied
        if e.replay is not None and e.index not in made_by_fits
    ]
    loaders: dict[str, str] = {}
    for _, before, _, call in fits:
        bare = {k: str(v) for k, v in call.options if k in ("train", "val")}
        loaders.update({v: f"batches for tm.{call.method} ({k})" for k, v in bare.items()})
        loss = dict(call.options).get("loss")
        if isinstance(loss, str) and loss not in LOSSES:  # a loss function of the user's
            bare["loss"] = loss
            loaders[loss] = f"the loss function tm.{call.method} used"
        steps.append(((before, 1), python_call(call, bare), ""))
    steps.sort(key=lambda s: s[0])
    variables = [(target.model_name, type(target.model).__name__)]
    session_args = [target.model_name]
    if target.optimizer is not None:
        variables.append((target.optimizer_name or "optimizer", type(target.optimizer).__name__))
        session_args.append(target.optimizer_name or "optimizer")
    scheduler_names = [
        (names.name_of(session.workspace, s, f"scheduler{i}"), type(s).__name__)
        for i, s in enumerate(scheduler_sync.roots(target.schedulers))
    ]
    variables += scheduler_names
    if scheduler_names:
        session_args.append(f"schedulers=[{', '.join(n for n, _ in scheduler_names)}]")
    variables += list(loaders.items())
    text = write_script(
        variables,
        f"tm = torchmagic.Session({', '.join(session_args)})",
        [(call, command) for _, call, command in steps],
        __version__,
        target.model_name,
    )
    write_text(text, where)
    return ExportReport(os.fspath(path), tuple(variables), len(steps))
