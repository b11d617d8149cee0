"""The Session class: the engine's one front door, a facade. Each public method checks
what it was given and delegates to the module of its domain in this package; what decides
things lives there (see the package's docstring for which module holds what)."""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Container, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..advice import Command
from ..checkpoint import ResumeReport, SaveReport
from ..data import ImageFolders
from ..devices.memory import CellWatcher
from ..devices.pinbench import PinReport
from ..diagnostics.compiled import CompileWatch
from ..diagnostics.doctor import DoctorReport
from ..evaluation.evaluate import EvaluateOptions, Evaluation
from ..evaluation.labels import ClassNames
from ..evaluation.predict import Prediction, Predictions, PredictOptions
from ..export import ExportOptions, ExportReport, InferenceReport
from ..modules import unwrap
from ..sharding import ShardReport
from ..surgery import edits
from ..surgery.history import ByteCap, Cleared, History
from ..surgery.results import Change, HistoryEntry, Replay
from ..training.amp import Accumulation, AmpController
from ..training.fit_events import FitHistory
from ..workspace import Workspace
from ..zoo import LoadedModel
from . import (
    checkpoint,
    data,
    diagnostics,
    distributed,
    evaluation,
    history,
    models,
    names,
    shared,
)
from .config import SessionConfig
from .facade_devices import DeviceFacade
from .facade_surgery import SurgeryFacade
from .facade_training import TrainingFacade


class Session(SurgeryFacade, TrainingFacade, DeviceFacade):
    """Transfer learning on live objects, with undo: surgery, training, devices, memory,
    mixed precision and diagnostics behind one object.

    Give it a model and optimizer (scripts), or a namespace dict in which it finds them by
    variable name (notebooks). Target strings use the target grammar: ``layer1-3``,
    ``features.0-6``, ``"*.bn*"``, ``model.fc``. Methods that take ``model`` take a
    variable name; without one they use the current model.

    ``owner`` names who made the session (``"train.py"``; the notebook's magics name
    themselves): a second session refused on a model whose history this one holds is
    told so by this name. Without it, the session is named by the model it was given.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        schedulers: Sequence[object] = (),
        namespace: MutableMapping | None = None,
        hidden: Container[str] = (),
        config: SessionConfig | None = None,
        owner: str | None = None,
    ) -> None:
        self.workspace = Workspace(
            names.namespace_of(model, optimizer, schedulers, namespace), hidden
        )
        self.config = config or SessionConfig()
        # every command, for undo, checkpoints and export; one per model (``shared``)
        self._history = History(owner or shared.default_owner(model))
        self.device: torch.device | None = None  # set_device(); None: where the model is
        self.amp = AmpController()
        self.fits: list[FitHistory] = []
        self.compile_watch = CompileWatch()  # compiled models as first seen, for doctor()
        self.cell_watch = CellWatcher()  # memory around each cell, for the notebook's watch
        self.loaded: dict[str, LoadedModel] = {}  # variable → what load_model built it with
        # each model's class names: given with labels= (undoable) or found by load_data
        self.class_names = ClassNames()
        self.last_pinbench: PinReport | None = None  # the doctor quotes its figure
        # step(accumulate=N): each optimizer's open window of micro-batches
        self._windows: weakref.WeakKeyDictionary[torch.optim.Optimizer, Accumulation] = (
            weakref.WeakKeyDictionary()
        )
        self._phase_schedulers: tuple[object, ...] = ()  # fine_tune's one-cycle, while it runs
        # each fit, fine_tune and AMP switch as a call, for export: (model, None for the
        # AMP policy of every model; newest command before, after it; the call)
        self._fit_calls: list[tuple[weakref.ReferenceType[nn.Module] | None, int, int, Replay]] = []
        if model is not None:  # a script's Session on a model the notebook edits: one history
            shared.join(self, unwrap(model), "model")

    # -- resolving -------------------------------------------------------------------

    def bound(
        self, model: str | None = None, optimizer: str | None = None, *, reading: bool = False
    ) -> edits.BoundModel:
        """The named (or current) model with the optimizer and schedulers bound to it;
        ``reading``: for a command that only shows, so a stale optimizer counts as none;
        otherwise the session takes the model's history (see ``shared``)."""
        target = names.bound(self.workspace, model, optimizer, reading)
        if not reading:
            shared.join(self, target.model, target.model_name)
        return target

    # -- history ---------------------------------------------------------------------

    def history_cap(self) -> ByteCap:
        """The bytes the undo history may keep alive, and why that many."""
        return history.cap(self)

    def prune_history(self) -> None:
        """Release the undo logs of commands whose model was rebound or whose optimizer
        was re-created: they cannot be undone, and would keep the old objects (and state
        set aside) alive. The notebook calls this after every cell."""
        history.prune(self)

    def history(self) -> tuple[HistoryEntry, ...]:
        """Every command so far, oldest first; stale entries can no longer be undone."""
        self.prune_history()
        return self._history.entries()

    def history_bytes(self, device_type: str | None = None) -> int:
        """Bytes of tensors the undo history keeps alive (on ``device_type``, or all)."""
        self.prune_history()
        return self._history.nbytes(device_type)

    @shared.serialised()
    def clear_history(self) -> Cleared:
        """Forget every command: nothing can be undone afterwards, and what the undo
        logs kept alive (optimizer state set aside, replaced layers) is released."""
        return self._history.clear()

    def undone(self) -> tuple[Command, ...]:
        """The commands :meth:`undo` reverted, oldest first."""
        return tuple(self._history.undone)

    @shared.serialised()
    def undo(self) -> Change:
        """Revert the newest command still applying to a bound model; atomic like the
        commands (under Ctrl-C too): reverted and out of the history, or neither."""
        return history.undo(self)

    # -- models and diagnostics --------------------------------------------------------

    @shared.serialised()
    def load_model(
        self,
        name: str,
        weights: str | None = "DEFAULT",
        *,
        num_classes: int | None = None,
        bind: str = "model",
        head_command: str | None = None,
    ) -> tuple[LoadedModel, Change | None]:
        """Build ``name`` (``resnet18``, ``timm:convnext_atto``, ``hf:vit``) with the modern
        ``weights=`` API and bind ``bind`` (the model), ``weights``, ``preprocess`` and
        ``categories`` in the namespace, so transforms and labels match the weights; with
        ``num_classes`` the head is replaced next, as an undoable history entry. Nothing is
        bound when the build fails (offline without cached weights: one error line).
        ``head_command``: how history shows the head replacement (a magic passes its own
        spelling)."""
        return models.load_model(self, name, weights, num_classes, bind, head_command)

    def use(self, name: str) -> str:
        """Make ``name`` the current model for commands that do not name one."""
        self.workspace.resolve_model(name)
        self.workspace.current = name
        return name

    def observe_compiled(self) -> None:
        """Remember compiled models as they are now, so :meth:`doctor` can tell later
        edits (the notebook calls this after every cell)."""
        self.compile_watch.observe(self.workspace.namespace, self.workspace.hidden)

    def doctor(self) -> DoctorReport:
        """The classic transfer-learning mistakes in the namespace; changes nothing."""
        return diagnostics.doctor(self)

    # -- leaving the kernel ----------------------------------------------------------

    def save(
        self, path: str | os.PathLike, model: str | None = None, *, sync: bool = False
    ) -> SaveReport:
        """Write what a fresh process needs to continue training the (current) model bit
        for bit: weights, optimizer state and param groups by parameter name, scheduler,
        GradScaler and RNG states, the AMP policy and the commands that made the structure
        (see ``core.checkpoint``). Atomic: ``path`` is never left half written. ``sync``:
        also on the disk before returning (survives a power loss, not only Ctrl-C)."""
        return checkpoint.save(self, path, model, sync)

    @shared.serialised()
    def load(
        self,
        path: str | os.PathLike,
        model: str | None = None,
        *,
        optimizer: str | None = None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> ResumeReport:
        """Continue from a :meth:`save` file on the (current) model, built the way the
        notebook first built it (with its optimizer and schedulers): the saved commands
        are replayed through this session's own edits (they join its history; they cannot
        be undone), then every state is loaded by name. Anything that does not match (the
        architecture, a head, the optimizer's class, the schedulers, the file itself) is
        refused before anything changes. ``scaler``: your own GradScaler to load into."""
        return checkpoint.load(self, path, model, optimizer, scaler)

    @shared.serialised()
    def shard(
        self,
        apply: Callable[[nn.Module], object],
        model: str | None = None,
        *,
        optimizer: str | None = None,
    ) -> ShardReport:
        """Shard the (current) model with FSDP2, its optimizer following: ``apply(model)``
        makes your ``fully_shard`` calls, then the param groups hold the sharded
        parameters (swapped in place, by name) and the state is sharded by
        torch.distributed.checkpoint, so the optimizer, its schedulers and a GradScaler
        keep working. On every rank, once, on the unsharded model (after a resume:
        ``resume(..., shard=apply)``). Commands before it can no longer be undone."""
        return distributed.shard(self, apply, model, optimizer)

    def export(
        self,
        path: str | os.PathLike,
        model: str | None = None,
        *,
        force: bool = ExportOptions.force,
        input_shape: Sequence[int] | None = ExportOptions.input_shape,
        tolerance: float = ExportOptions.tolerance,
    ) -> ExportReport | InferenceReport:
        """Export the (current) model by the path's suffix. ``.py``: its commands as a
        Python script of Session calls, fits, fine_tune runs and AMP switches included, a
        batch job's skeleton (see ``core.export.script``). ``.pt2`` (torch.export, dynamic
        batch), ``.safetensors`` (the plain architecture's weights), ``.onnx``: the model
        for inference, LoRA merged and BatchNorm in eval in a copy, labels and
        preprocessing stored, read back and compared with the live model (largest
        difference at most ``tolerance``) before it is kept (see
        ``core.export.inference``, which also says how the input is found when
        ``input_shape``, one batch's shape, is not given). Written atomically; an existing
        file is replaced only with ``force``."""
        shape = None if input_shape is None else tuple(input_shape)
        options = ExportOptions(force=force, input_shape=shape, tolerance=tolerance)
        return checkpoint.export(self, path, model, options)

    # -- your own data ---------------------------------------------------------------

    def load_data(
        self,
        path: str | os.PathLike,
        *,
        model: str | None = None,
        bind: tuple[str, str] = ("train_loader", "val_loader"),
        **options: Any,
    ) -> ImageFolders:
        """Bind a training and a validation loader over ``path``'s class folders
        (``train/`` and ``val/``, or one folder split by ``valid``), transformed as the
        (current) model's weights expect, and keep the folder names as the model's class
        names (``replace_head`` without a count uses them). ``options``: the fields of
        ``LoadDataOptions`` (valid, batch, size, workers, seed). Refused in one line with
        nothing bound (a missing folder, an empty class, an unreadable image...)."""
        return data.load_data(self, path, model, bind, options)

    # -- after training: evaluate, predict, class names ----------------------------------

    def evaluate(
        self,
        data: object,
        model: str | None = None,
        options: EvaluateOptions | None = None,
        **given: Any,
    ) -> Evaluation:
        """Measure the (current) model on ``data`` (a loader or its variable name):
        accuracy, loss, confusion matrix, per-class precision / recall / f1, the most
        confused pairs, the ``worst`` samples by loss, top-k accuracy, and with
        ``against`` the paired comparison with an earlier evaluation. Runs in eval mode
        under ``inference_mode`` with the session's device and AMP policy; the model and
        every random state are left exactly as they were. ``given``: fields of
        :class:`EvaluateOptions` (``worst=16``)."""
        options = replace(options or EvaluateOptions(), **given)
        return evaluation.evaluate(self, data, model, options)

    def predict(
        self,
        input: object,
        model: str | None = None,
        options: PredictOptions | None = None,
        **given: Any,
    ) -> Prediction | Predictions:
        """The (current) model's classes for ``input`` (an image path, a folder of images,
        a PIL image, a tensor, or a variable holding one), best first, through the
        model's evaluation transforms (never the training augmentation): a Prediction for
        one input, Predictions for a folder or a batch. ``given``: fields of
        :class:`PredictOptions` (``top=3``)."""
        options = replace(options or PredictOptions(), **given)
        return evaluation.predict(self, input, model, options)

    def labels(self, model: str | None = None) -> tuple[str, ...] | None:
        """The (current) model's class names as the session knows them (given with
        ``labels=``, its config's ``id2label``, its weights' categories), or None."""
        return evaluation.known_names(self, model)


def resume(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    schedulers: Sequence[object] = (),
    scaler: torch.amp.GradScaler | None = None,
    *,
    shard: Callable[[nn.Module], object] | None = None,
) -> Session:
    """A Session over ``model`` and ``optimizer`` (built the way the notebook first built
    them, e.g. ``resnet18(num_classes=10)``, ``AdamW(model.parameters())``) and its
    ``schedulers``, continued from the :meth:`Session.save` file at ``path``: the saved
    commands replayed, every state loaded by name. Refused in one line, with nothing
    changed, when anything does not match. ``shard``: your ``fully_shard`` calls, made
    after the load on every rank (see :meth:`Session.shard`)."""
    session = Session(
        model, optimizer, schedulers=schedulers, owner=f"the Session resumed from {path}"
    )
    if shard is not None:
        distributed.check_shardable(session)  # before the load changes anything
    report = session.load(path, scaler=scaler)
    for line in report.warnings:  # a batch job shows no report: Python's warnings do
        warnings.warn(line, stacklevel=2)
    if shard is not None:
        session.shard(shard)
    return session
