"""The Session class: the engine's one front door, a facade. Each public method checks
what it was given and delegates to the module of its domain in this package; what decides
things lives there (see the package's docstring for which module holds what)."""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Container, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..advice import Command
from ..checkpoint import ResumeReport, SaveReport
from ..data import ImageFolders
from ..data.transforms import Pipelines
from ..devices.batch_size import BatchSizeReport
from ..devices.compare import CompareReport
from ..devices.device import DeviceReport, MoveReport, list_devices, resolve_device
from ..devices.estimate import Estimate
from ..devices.memory import CellWatcher, MemoryReport, ResetReport
from ..devices.memory import reset_peaks as reset_peak_counters
from ..devices.pinbench import PinReport
from ..devices.placement import CheckReport
from ..diagnostics.compiled import CompileWatch
from ..diagnostics.doctor import DoctorReport, diagnose
from ..evaluation.evaluate import EvaluateOptions, Evaluation
from ..evaluation.labels import ClassNames
from ..evaluation.predict import Prediction, Predictions, PredictOptions
from ..export import ExportOptions, ExportReport, InferenceReport
from ..modules import unwrap
from ..options import (
    FineTuneOptions,
    FitOptions,
    FreezeOptions,
    LoraOptions,
    LrFindOptions,
    ReplaceHeadOptions,
    UnfreezeOptions,
    checked_options,
    class_names,
)
from ..sharding import ShardReport
from ..surgery import edits
from ..surgery.grammar import LrSpec
from ..surgery.history import ByteCap, Cleared, History
from ..surgery.results import Change, HistoryEntry, Replay, SummaryReport
from ..training.amp import Accumulation, AmpController, AmpStatus, cell_autocast
from ..training.fit_events import FitHistory, FitObserver
from ..training.lr_find import LrFindResult
from ..training.progressive import Monitor
from ..training.recipe import FineTuneResult
from ..training.schedule_steps import SchedStep
from ..workspace import Workspace
from ..zoo import LoadedModel
from . import (
    commands,
    data,
    evaluation,
    fit_runs,
    fsdp,
    hardware,
    models,
    names,
    save_load,
    shared,
    undo,
)
from .config import SessionConfig


class Session:
    """Transfer learning on live objects, with undo: surgery, training, devices, memory,
    mixed precision and diagnostics behind one object.

    Give it a model and optimizer (scripts), or a namespace dict in which it finds them by
    variable name (notebooks). Target strings use the target grammar: ``layer1-3``,
    ``features.0-6``, ``"*.bn*"``, ``model.fc``. Methods that take ``model`` take a
    variable name; without one they use the current model.

    ``owner`` names who made the session (``"train.py"``; the notebook's magics name
    themselves): a second session refused on a model whose history this one holds is
    told so by this name. Without it, the session is named by the model it was given.

    A command's settings come as keywords (scripts), or as one ready options object,
    ``options=FreezeOptions(...)`` (what the magics pass; see ``core.options``, where
    every default is written), never both.
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
        # each model's transforms as load_data built them (its size): what predict and
        # the export's preprocessing use before the weights' own
        self.pipelines: weakref.WeakKeyDictionary[nn.Module, Pipelines] = (
            weakref.WeakKeyDictionary()
        )
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
        return undo.cap(self)

    def prune_history(self) -> None:
        """Release the undo logs of commands whose model was rebound or whose optimizer
        was re-created: they cannot be undone, and would keep the old objects (and state
        set aside) alive. The notebook calls this after every cell."""
        undo.prune(self)

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

    @shared.serialised(pinned=True)
    def undo(self) -> Change:
        """Revert the newest command still applying to a bound model; atomic like the
        commands (under Ctrl-C too): reverted and out of the history, or neither."""
        return undo.undo(self)

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
        workspace = self.workspace
        return diagnose(
            workspace.namespace,
            hidden=workspace.hidden,
            amp=self.amp,
            compile_watch=self.compile_watch,
            device=self.device,
            weights=self.loaded,
            replaced_heads={e.model_name for e in self.history() if e.action == "replace_head"},
            fits=self.fits,
            pinbench=self.last_pinbench,
            history=self._history,
        )

    # -- leaving the kernel ----------------------------------------------------------

    def save(
        self, path: str | os.PathLike, model: str | None = None, *, sync: bool = False
    ) -> SaveReport:
        """Write what a fresh process needs to continue training the (current) model bit
        for bit: weights, optimizer state and param groups by parameter name, scheduler,
        GradScaler and RNG states, the AMP policy and the commands that made the structure
        (see ``core.checkpoint``). Atomic: ``path`` is never left half written. ``sync``:
        also on the disk before returning (survives a power loss, not only Ctrl-C)."""
        return save_load.save(self, path, model, sync)

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
        return save_load.load(self, path, model, optimizer, scaler)

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
        return fsdp.shard(self, apply, model, optimizer)

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
        return save_load.export(self, path, model, options)

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

    # -- surgery ---------------------------------------------------------------------

    @shared.serialised(pinned=True)
    def freeze(
        self,
        *targets: str,
        exclude: Sequence[str] = FreezeOptions.exclude,
        bn: str | None = FreezeOptions.bn,
        options: FreezeOptions | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Stop training ``targets``: requires_grad off, out of the optimizer (state set
        aside for undo), BatchNorm per policy. No targets means the whole model."""
        given = checked_options(options, FreezeOptions(tuple(exclude), bn))
        return commands.freeze(
            self, targets, given, optimizer=optimizer, dry_run=dry_run, command=command
        )

    @shared.serialised(pinned=True)
    def unfreeze(
        self,
        *targets: str,
        lr: LrSpec = UnfreezeOptions.lr,
        wd: float | None = UnfreezeOptions.wd,
        exclude: Sequence[str] = UnfreezeOptions.exclude,
        options: UnfreezeOptions | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Train ``targets`` again, each block in its own named param group.

        ``lr`` is a float, or ``(first, last)`` for a geometric spread over the blocks in
        module order; without it, ``unfreeze_lr_ratio`` × the head group's lr. ``wd``
        overrides weight decay for the new groups.
        """
        given = checked_options(options, UnfreezeOptions(lr, wd, tuple(exclude)))
        return commands.unfreeze(
            self, targets, given, optimizer=optimizer, dry_run=dry_run, command=command
        )

    @shared.serialised(pinned=True)
    def replace_head(
        self,
        where: str | None,
        num_classes: int | None = ReplaceHeadOptions.num_classes,
        *,
        dropout: float | None = ReplaceHeadOptions.dropout,
        labels: Sequence[str] | None = ReplaceHeadOptions.labels,
        options: ReplaceHeadOptions | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Swap the head for a fresh layer with ``num_classes`` outputs.

        ``where`` is ``"auto"``/None (search the current model), a path to the head
        (``"fc"``, ``"model.classifier.6"``), or a model/sub-tree to search. ``labels``
        names the classes in a Hugging Face config; the class count is required unless
        ``labels`` gives it.
        """
        built = ReplaceHeadOptions(num_classes, dropout, class_names(labels))
        given = checked_options(options, built)
        return commands.replace_head(
            self, where, given, optimizer=optimizer, dry_run=dry_run, command=command
        )

    @shared.serialised(pinned=True)
    def lora(
        self,
        *targets: str | Sequence[str],
        r: int = LoraOptions.r,
        alpha: float = LoraOptions.alpha,
        dropout: float = LoraOptions.dropout,
        use_dora: bool = LoraOptions.use_dora,
        use_rslora: bool = LoraOptions.use_rslora,
        lr: float | None = LoraOptions.lr,
        options: LoraOptions | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Low-rank adapters (peft's LoRA layers, rank ``r``, scale ``alpha / r``, or
        ``alpha / sqrt(r)`` with ``use_rslora``; DoRA with ``use_dora``) on the Linear /
        Conv1D / Conv2d / Embedding layers ``targets`` name or contain, in place: their
        base weights stop training and leave the optimizer, the adapters train in a new
        ``lora`` group at base lr ``lr`` (default: the head group's base lr). A target is
        the grammar's, or peft's spelling: ``"q_proj,v_proj"`` or a list
        ``["q_proj", "v_proj"]`` names every module whose path ends so, as does a name
        that is no path from the root (``"c_attn"``). See ``core.surgery.lora``."""
        built = LoraOptions(r, alpha, dropout, use_dora, use_rslora, lr)
        given = checked_options(options, built)
        return commands.add_lora(
            self, targets, given, optimizer=optimizer, dry_run=dry_run, command=command
        )

    @shared.serialised(pinned=True)
    def merge_lora(
        self,
        model: str | None = None,
        *,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Fold the (current) model's LoRA adapters into its weights: the layers get their
        old names and types back, trainable as before :meth:`lora`; the adapters leave the
        optimizer (their group stays, emptied)."""
        return commands.merge_lora(self, model, optimizer, dry_run, command)

    @shared.serialised(pinned=True)
    def lora_off(self, model: str | None = None, *, command: Command | None = None) -> Change:
        """The (current) model without its LoRA adapters' contribution (kept, not merged)."""
        return commands.switch_lora(self, model, False, command)

    @shared.serialised(pinned=True)
    def lora_on(self, model: str | None = None, *, command: Command | None = None) -> Change:
        """The LoRA adapters switched off by :meth:`lora_off` contribute again."""
        return commands.switch_lora(self, model, True, command)

    def summary(
        self,
        where: str | None = None,
        depth: int | None = None,
        input_shape: Sequence[int] | None = None,
    ) -> SummaryReport:
        """A bounded table of the model (or a sub-tree) with trainable state and groups;
        with ``input_shape`` (batch first, ``(1, 3, 224, 224)``) each module's output shape
        and bytes too, from one forward on the meta device (no memory, no arithmetic)."""
        return commands.summary(self, where, depth, input_shape)

    # -- training --------------------------------------------------------------------

    @shared.serialised("a fit")
    def fit(
        self,
        train: object,
        *,
        model: str | None = None,
        val: object | None = None,
        epochs: int = FitOptions.epochs,
        max_steps: int | None = FitOptions.max_steps,
        loss: str | Callable = FitOptions.loss,
        cache_features: bool = FitOptions.cache_features,
        optimizer: str | None = None,
        observer: FitObserver | None = None,
        sched_step: SchedStep | None = FitOptions.sched_step,
        unfreeze: Sequence[str] | str = FitOptions.unfreeze,
        every: int | None = FitOptions.every,
        patience: int | None = FitOptions.patience,
        lr_ratio: float = FitOptions.lr_ratio,
        monitor: Monitor = FitOptions.monitor,
        early_stop: bool = FitOptions.early_stop,
        keep_best: bool = FitOptions.keep_best,
        accumulate: int = FitOptions.accumulate,
        clip: float | None = FitOptions.clip,
        metric: Sequence[str] | str = FitOptions.metric,
        export: str | None = FitOptions.export,
        options: FitOptions | None = None,
    ) -> FitHistory:
        """Train the (current) model on ``train`` with its optimizer, its schedulers and
        the AMP policy; returns the history, which the session also keeps in ``fits``.
        ``sched_step`` ("batch" or "epoch") steps every scheduler at that granularity
        instead of each one's own (see ``core.training.schedule_steps``).

        ``accumulate=N``: one optimizer step per N batches, each loss divided by N (steps,
        ``max_steps`` and per-batch schedulers count optimizer steps; an epoch's last,
        partial window steps). ``clip``: the largest total gradient norm of the
        optimizer's parameters before each step, after unscaling (see
        ``core.training.amp``).

        Progressive unfreezing (see ``core.training.progressive``): ``unfreeze`` lists
        blocks (target grammar, or one comma-separated string) unfrozen one at a time,
        every ``every`` epochs or after ``patience`` epochs without improvement of the
        validation ``monitor`` ("loss", "acc" or a metric's name), the k-th at the base lr
        of the one before × ``lr_ratio`` (the first: the head group's × ``lr_ratio``), each
        through :meth:`unfreeze` (a history entry). ``early_stop`` ends the run when the
        last block is unfrozen and the metric stalls for ``patience`` (else ``every``) more
        epochs; ``keep_best`` loads the best epoch's weights back at the end (one host
        copy of the ``state_dict``).

        ``metric``: torchmetrics classification metrics by name (accuracy, f1, precision,
        recall, top5, auroc; a list or "f1,auroc") measured on ``val`` after each epoch,
        kept in each epoch's ``val_metrics``; ``monitor`` may name one (larger is better).
        ``export``: a ``.pt2`` / ``.safetensors`` / ``.onnx`` path the weights the model
        holds after the run (with ``keep_best``: the best epoch's) are exported to, as
        :meth:`export` does (the file is replaced; the path and the model's input are
        checked before the run).
        """
        built = FitOptions(
            epochs,
            max_steps,
            loss,
            cache_features,
            sched_step,
            unfreeze,
            every,
            patience,
            lr_ratio,
            monitor,
            early_stop,
            keep_best,
            accumulate,
            clip,
            metric,
            export,
        )
        return fit_runs.fit(
            self,
            train,
            checked_options(options, built),
            model=model,
            val=val,
            optimizer=optimizer,
            observer=observer,
        )

    @shared.serialised("an lr range test")
    def lr_find(
        self,
        train: object,
        *,
        model: str | None = None,
        start: float = LrFindOptions.start,
        end: float = LrFindOptions.end,
        steps: int = LrFindOptions.steps,
        apply: bool = LrFindOptions.apply,
        optimizer: str | None = None,
        observer: FitObserver | None = None,
        loss: str | Callable = LrFindOptions.loss,
        options: LrFindOptions | None = None,
    ) -> LrFindResult:
        """The lr range test on what is trainable now (see ``core.training.lr_find``):
        every group's lr grows together from ``start`` to ``end`` over ``steps`` steps,
        ratios kept; afterwards everything is as before, bit for bit. ``apply`` sets the
        head group's base lr to the suggestion, the other groups' in proportion, as one
        history entry (undoable). Each step is one batch, never accumulated: with
        ``fit(accumulate=N)`` each loss is divided by N, so a step's gradient has the same
        scale and the suggestion carries over."""
        built = LrFindOptions(start, end, steps, apply, loss)
        return fit_runs.lr_find(
            self,
            train,
            checked_options(options, built),
            model=model,
            optimizer=optimizer,
            observer=observer,
        )

    @shared.serialised(pinned=True)
    def set_base_lrs(
        self,
        lrs: Mapping[int, float],
        *,
        model: str | None = None,
        optimizer: str | None = None,
        command: Command | None = None,
    ) -> Change:
        """Set the base lr of param groups by index (``{0: 1e-3, 2: 1e-4}``), every
        scheduler kept in step, as one undoable command (what ``lr_find(apply=True)``
        does with its suggestion)."""
        return commands.set_base_lrs(self, lrs, model, optimizer, command)

    @shared.serialised("a fine_tune run")
    def fine_tune(
        self,
        train: object,
        *,
        val: object,
        epochs: int,
        freeze_epochs: int = FineTuneOptions.freeze_epochs,
        lr: float | None = FineTuneOptions.lr,
        model: str | None = None,
        loss: str | Callable = FineTuneOptions.loss,
        optimizer: str | None = None,
        observer: FitObserver | None = None,
        sched_step: SchedStep | None = FineTuneOptions.sched_step,
        accumulate: int = FineTuneOptions.accumulate,
        clip: float | None = FineTuneOptions.clip,
        schedule: str | None = FineTuneOptions.schedule,
        bn: str | None = FineTuneOptions.bn,
        metric: Sequence[str] | str = FineTuneOptions.metric,
        monitor: Monitor = FineTuneOptions.monitor,
        keep_best: bool = FineTuneOptions.keep_best,
        export: str | None = FineTuneOptions.export,
    ) -> FineTuneResult:
        """fastai's ``fine_tune`` as four of the session's own commands, each in the
        history: ``freeze(model, exclude=[head], bn=bn)``, ``fit(epochs=freeze_epochs)``,
        ``unfreeze(*blocks, lr=(lr / 100, lr))``, ``fit(epochs=epochs)``. The blocks are
        the model's top-level children holding parameters, head included (see
        ``core.training.recipe``); ``lr`` defaults to the head group's base lr after the
        first run. The observer sees both runs; ``accumulate`` and ``clip`` apply to both.

        ``schedule="one-cycle"``: each run under a fresh OneCycleLR over the optimizer
        (fastai's conventions: head phase pct_start 0.99 and div 25, unfrozen phase 0.3
        and div 5, each group peaking at its base lr); refused while another scheduler is
        bound to the optimizer. After each run every group's lr is its base lr again.

        ``metric`` as in :meth:`fit`, for both runs; ``keep_best`` (on ``monitor``) keeps
        the best epoch of the second run; ``export`` writes the weights the model holds
        at the end (the best epoch's with ``keep_best``) for inference, as in :meth:`fit`."""
        options = FineTuneOptions(
            epochs,
            freeze_epochs,
            lr,
            loss,
            sched_step,
            accumulate,
            clip,
            schedule,
            bn,
            metric,
            monitor,
            keep_best,
            export,
        )
        return fit_runs.fine_tune(
            self,
            train,
            options,
            val=val,
            model=model,
            optimizer=optimizer,
            observer=observer,
        )

    # -- devices and memory ----------------------------------------------------------

    def devices(self) -> DeviceReport:
        """Every device this process can use, with the session's marked."""
        return list_devices(self.device)

    def set_device(self, spec: str | torch.device) -> DeviceReport:
        """Make ``spec`` (``"cuda:1"``, ``"cpu"``, ``"mps"``, ``"auto"``) the session's
        device, where :meth:`move` sends models and :meth:`fit` expects them; returns
        the device list with it marked."""
        self.device = resolve_device(spec)
        return self.devices()

    def model_device(self, model: nn.Module) -> torch.device:
        """Where ``model``'s parameters live (the CPU for a model without any)."""
        return hardware.model_device(model)

    def device_type(self, model: str | None = None) -> str:
        """The session's device type, else that of the (current) model's parameters,
        else (no model yet) that of the best device available."""
        return hardware.device_type(self, model)

    @shared.serialised()
    def move(self, model: str | None = None) -> MoveReport:
        """Move the (current) model with its optimizer state and the GradScaler to the
        session's device (chosen automatically when none is set), keeping every
        Parameter object; that device becomes the session's."""
        return hardware.move(self, model)

    def check(self, model: str | None = None) -> CheckReport:
        """Tensors of the (current) model, its optimizer and the GradScaler that are not
        where the model's parameters are, each with its fix; changes nothing."""
        return hardware.check(self, model)

    def pinbench(self, loader: object) -> PinReport:
        """Time pageable against pinned host→device copies of one batch of ``loader``
        (a variable name, a DataLoader, any iterable of batches, or a batch)."""
        return hardware.pinbench(self, loader)

    def compare_devices(
        self,
        loader: object,
        *,
        model: str | None = None,
        optimizer: str | None = None,
        loss: str | Callable = "cross_entropy",
        steps: int = 5,
    ) -> CompareReport:
        """Time a few real training steps of copies of the (current) model, with its
        optimizer's class, groups and state, on one batch of ``loader`` on the CPU and on
        every accelerator present, host→device copy included: is the GPU worth it for
        this model and batch? The live model, optimizer and RNG are left as they were."""
        return hardware.compare_devices(self, loader, model, optimizer, loss, steps)

    def batch_size(
        self,
        input_shape: Sequence[int],
        *,
        model: str | None = None,
        optimizer: str | None = None,
        budget: int | None = None,
        max_batch: int | None = None,
        effective_batch: int | None = None,
    ) -> BatchSizeReport:
        """The largest batch of ``input_shape`` samples (no batch dimension) whose training
        step fits where the (current) model lives, under the session's AMP policy; on the
        CPU within ``budget`` bytes (default: the RAM available). State is restored.
        ``effective_batch``: the samples wanted per optimizer step; the report's
        ``accumulation`` says which ``fit(accumulate=…)`` and batch size reach it."""
        return hardware.batch_size(
            self,
            input_shape,
            model=model,
            optimizer=optimizer,
            budget=budget,
            max_batch=max_batch,
            effective_batch=effective_batch,
        )

    def memory(self, model: str | None = None) -> MemoryReport:
        """Memory in use on the (current) model's device, broken down into parameters,
        gradients, optimizer state and the rest; the device figures alone when no model
        is named and none can be found."""
        return hardware.memory(self, model)

    def reset_peaks(self, tracebacks: bool = False) -> ResetReport:
        """Start the peak-memory counters again; ``tracebacks`` also forgets the last
        traceback, whose frames can keep tensors alive."""
        return reset_peak_counters(tracebacks, self.workspace.namespace)

    def estimate(
        self,
        model: str | None = None,
        *,
        optimizer_class: str | type[torch.optim.Optimizer] | None = None,
        input_shape: Sequence[int] | None = None,
    ) -> Estimate:
        """Bytes a training step of the (current) model will hold: weights, gradients,
        optimizer state (its own optimizer's, or ``optimizer_class``'s such as
        ``"AdamW"``) and, given ``input_shape``, saved activations."""
        return hardware.estimate(self, model, optimizer_class, input_shape)

    # -- mixed precision -------------------------------------------------------------

    def amp_status(self) -> AmpStatus:
        """The precision policy: off, or autocast dtype and device type, with the scaler."""
        return self.amp.status()

    def amp_on(self, mode: str = "auto", model: str | None = None) -> AmpStatus:
        """Autocast for training on the session's device (else the current model's):
        ``mode`` is ``"auto"`` (bf16 where supported), ``"bf16"`` or ``"fp16"`` (with a
        GradScaler)."""
        status = self.amp.turn_on(self.device_type(model), mode)
        fit_runs.record_call(self, None, Replay("amp_on", (), (("mode", mode),)))
        return status

    def amp_off(self) -> AmpStatus:
        """Plain precision again; an fp16 GradScaler's state is kept for next time."""
        status = self.amp.turn_off()
        fit_runs.record_call(self, None, Replay("amp_off"))
        return status

    def autocast(self, mode: str | None = None) -> AbstractContextManager:
        """``with tm.autocast():`` around forward and loss in a hand-written loop (the
        session's policy); with ``mode``, that precision for this block only, on the
        session's device type, leaving the policy as it is."""
        if mode is None:
            return self.amp.autocast()
        return cell_autocast(self.amp, mode, self.device_type())

    @shared.serialised()
    def step(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        *,
        accumulate: int = 1,
        clip: float | None = None,
        last: bool = False,
    ) -> bool:
        """backward, (unscale, clip) step, scaler update, zero_grad — correct under every
        precision policy; returns whether the optimizer stepped.

        ``accumulate=N``: the loss is backpropagated divided by N and the optimizer steps
        on every N-th call for it, or on a call with ``last=True`` (the epoch's last
        batch: the partial window steps). ``clip``: the largest total gradient norm of
        the optimizer's parameters, applied after unscaling. Changing either while a
        window is open is refused."""
        return fit_runs.step(self, loss, optimizer, accumulate, clip, last)


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
        fsdp.check_shardable(session)  # before the load changes anything
    report = session.load(path, scaler=scaler)
    for line in report.warnings:  # a batch job shows no report: Python's warnings do
        warnings.warn(line, stacklevel=2)
    if shard is not None:
        session.shard(shard)
    return session
