"""The engine's one front door: every capability a magic has is a Session method, for
notebooks and scripts alike. A Session resolves names, runs each edit inside a transaction,
keeps the history for undo, and delegates the rest to its domain (devices, memory, AMP,
training, diagnostics).

Notebook: the magics hold one Session over the kernel's ``user_ns``. Script::

    tm = torchmagic.Session(model, optimizer, schedulers=[scheduler])
    tm.freeze("layer1-3")
    tm.replace_head("fc", 10)
    tm.unfreeze("layer4", lr=1e-4)
    tm.undo()

Values are typed (``lr=(1e-5, 1e-4)``, ``input_shape=(8, 3, 224, 224)``); parsing the
text of a magic line is the grammar's job. Refusals name the Python parameter at fault.
"""

from __future__ import annotations

import difflib
import math
import os
import weakref
from collections.abc import (
    Callable,
    Container,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
    Sized,
)
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..version import __version__
from . import checkpoint, distributed
from .advice import Advice, Call, Command, as_advice, spelled
from .checkpoint import ResumeReport, SaveReport
from .choices import SCHEDULES
from .devices.batch_size import BatchSizeReport, check_effective_batch, find_batch_size
from .devices.compare import CompareReport, compare
from .devices.device import DeviceReport, MoveReport, list_devices, resolve_device
from .devices.device import move as move_model
from .devices.estimate import Estimate
from .devices.estimate import estimate as estimate_step
from .devices.hostmem import machine_memory
from .devices.memory import MemoryReport, ResetReport, breakdown
from .devices.memory import reset_peaks as reset_peak_counters
from .devices.pinbench import PinReport
from .devices.pinbench import pinbench as time_host_copies
from .devices.placement import CheckReport, find_misplaced
from .diagnostics.compiled import CompileWatch
from .diagnostics.doctor import DoctorReport, diagnose
from .errors import TorchMagicError
from .export import ExportReport, python_call
from .export import script as write_script
from .export import write as write_text
from .modules import unwrap
from .surgery import edits, heads, lora, model_checks, scheduler_sync
from .surgery.base_lrs import base_lrs, set_base_lrs
from .surgery.batchnorm import POLICIES
from .surgery.counting import count, describe_groups, group_keys
from .surgery.grammar import LrSpec, Target, check_positive, parse_targets, spread_lrs
from .surgery.history import REBOUND, REPLAYED, ByteCap, Cleared, History, Record, byte_cap
from .surgery.results import Change, Counts, Effect, HistoryEntry, Replay, SummaryReport
from .surgery.selection import resolve, select
from .surgery.summary import summarize
from .surgery.transaction import Transaction, uninterrupted
from .training.amp import Accumulation, AmpController, AmpStatus, cell_autocast
from .training.fit import (
    FitHistory,
    FitObserver,
    FitPlan,
    StopReason,
    check_plan,
    resolve_loss,
)
from .training.fit import fit as run_fit
from .training.lr_find import LrFindResult, check_range, find_lr
from .training.progressive import Monitor, Pacing, check_pacing
from .training.recipe import (
    HEAD_PHASE,
    UNFROZEN_PHASE,
    FineTuneResult,
    OneCyclePhase,
    fine_tune_blocks,
    one_cycle_phase,
)
from .training.schedule_steps import SchedStep
from .workspace import StaleOptimizerError, Workspace
from .zoo import LoadedModel, check_binding
from .zoo import load_model as build_model


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


class Session:
    """Transfer learning on live objects, with undo: surgery, training, devices, memory,
    mixed precision and diagnostics behind one object.

    Give it a model and optimizer (scripts), or a namespace dict in which it finds them by
    variable name (notebooks). Target strings use the target grammar: ``layer1-3``,
    ``features.0-6``, ``"*.bn*"``, ``model.fc``. Methods that take ``model`` take a
    variable name; without one they use the current model.
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
    ) -> None:
        if namespace is None:
            namespace = {"schedulers": list(schedulers)}
            if model is not None:
                namespace["model"] = model
            if optimizer is not None:
                namespace["optimizer"] = optimizer
        self.workspace = Workspace(namespace, hidden)
        self.config = config or SessionConfig()
        self._history = History()
        self.device: torch.device | None = None  # set_device(); None: where the model is
        self.amp = AmpController()
        self.fits: list[FitHistory] = []
        self.compile_watch = CompileWatch()  # compiled models as first seen, for doctor()
        self.loaded: dict[str, LoadedModel] = {}  # variable → what load_model built it with
        self.last_pinbench: PinReport | None = None  # the doctor quotes its figure
        # step(accumulate=N): each optimizer's open window of micro-batches
        self._windows: weakref.WeakKeyDictionary[torch.optim.Optimizer, Accumulation] = (
            weakref.WeakKeyDictionary()
        )
        self._phase_schedulers: tuple[object, ...] = ()  # fine_tune's one-cycle, while it runs
        # each fit as a call, for export: (model, newest command before, after it, call)
        self._fit_calls: list[tuple[weakref.ReferenceType[nn.Module], int, int, Replay]] = []

    # -- resolving -------------------------------------------------------------------

    def _target(
        self, name: str, model: nn.Module, optimizer: str | None, reading: bool = False
    ) -> edits.BoundModel:
        """``model`` with its optimizer and schedulers. An optimizer holding none of its
        parameters is refused; ``reading`` (commands that only show) treats it as none."""
        with self.workspace.pinned():
            try:
                opt_name, opt = self.workspace.resolve_optimizer(name, unwrap(model), optimizer)
            except StaleOptimizerError:
                if not reading:
                    raise
                opt_name, opt = None, None
            ws = self.workspace
            real = unwrap(model)
            return edits.BoundModel(
                real,
                name,
                opt,
                opt_name,
                ws.schedulers(opt) if opt is not None else [],
                names=ws.names(),
                rebuilt=None if opt_name is None else ws.rebuilt(opt_name),
                ema_copies=ws.ema_copies(real),
            )

    def bound(
        self, model: str | None = None, optimizer: str | None = None, *, reading: bool = False
    ) -> edits.BoundModel:
        """The named (or current) model with the optimizer and schedulers bound to it;
        ``reading``: for a command that only shows, so a stale optimizer counts as none."""
        with self.workspace.pinned():
            name, module = self.workspace.resolve_model(model)
            return self._target(name, module, optimizer, reading)

    def _selection(self, targets: Sequence[str], exclude: Sequence[str], optimizer: str | None):
        with self.workspace.pinned():
            parsed = parse_targets(targets) if targets else ()
            excluded = parse_targets(exclude)
            name, model, relative = self.workspace.split_root(parsed)
            target = self._target(name, model, optimizer)
            model_checks.check_editable(target.model, name)
            relative_excluded = [self.workspace.relative_to(name, t) for t in excluded]
            return target, select(target.model, relative, relative_excluded)

    def _one_module(
        self, where: str | None, optimizer: str | None = None, reading: bool = False
    ) -> tuple[edits.BoundModel, str, nn.Module]:
        """The model ``where`` names (or the current one) and the one module inside it
        that ``where``'s path names: (bound model, relative name, module). ``edit``:
        refuse models surgery cannot edit, else only those it cannot read."""
        with self.workspace.pinned():
            if where is None:
                name, model = self.workspace.resolve_model()
                relative = None
            else:
                name, model, relative_targets = self.workspace.split_root(parse_targets([where]))
                relative = relative_targets[0]
            target = self._target(name, model, optimizer, reading)
            check = model_checks.check_readable if reading else model_checks.check_editable
            check(target.model, name)
            if relative is None or relative.is_whole:
                return target, "", target.model
            hits = resolve(target.model, relative)
            if len(hits) != 1:
                raise TorchMagicError(
                    f"'{where}' names {len(hits)} modules; name one", param="where"
                )
            return target, hits[0][0], hits[0][1]

    def _variable(self, value: object, param: str) -> object:
        """``value``, or the object bound to it when it is a variable name."""
        if not isinstance(value, str):
            return value
        if value not in self.workspace.namespace:
            names = [name for name, _ in self.workspace.items()]
            close = difflib.get_close_matches(value, names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise TorchMagicError(f"no variable named '{value}' for {param}{hint}", param=param)
        return self.workspace.namespace[value]

    def _replay(
        self, method: str, targets: Sequence[str], exclude: Sequence[str], **options: object
    ) -> Replay:
        """``method``'s call with its targets relative to the model they name, so that it
        replays on the same model under any variable name."""
        name, _, relative = self.workspace.split_root(parse_targets(targets))
        excluded = [self.workspace.relative_to(name, t) for t in parse_targets(exclude)]
        if excluded:
            options["exclude"] = tuple(_relative_text(t) for t in excluded)
        return Replay(method, tuple(_relative_text(t) for t in relative), _options(**options))

    # -- running ---------------------------------------------------------------------

    def _run(
        self,
        action: str,
        command: Command,
        target: edits.BoundModel,
        dry_run: bool,
        step: Callable[[Transaction], Effect],
        replay: Replay | None = None,
    ) -> Change:
        """Run ``step`` as one atomic command: applied and in the history, or not at all
        (also under Ctrl-C, which waits until the end). ``replay``: the call that makes
        it again on a freshly built model (what a checkpoint keeps)."""
        self.prune_history()
        notes = distributed.check_surgery(action, target.model, self.workspace.items())

        def apply(tx: Transaction) -> Change:
            before = count(target.model)
            groups_before = group_keys(target.optimizer)
            state_before = edits.fingerprint(target)
            effect = step(tx)
            return Change(
                action=action,
                command=command,
                model_name=target.model_name,
                effect=replace(effect, notes=effect.notes + notes),
                before=before,
                after=count(target.model),
                optimizer_name=target.optimizer_name,
                groups=describe_groups(
                    target.optimizer, groups_before, target.schedulers, target.names
                ),
                dry_run=dry_run,
                unchanged=edits.fingerprint(target) == state_before,
            )

        change, dropped = uninterrupted(lambda: self._atomically(target, apply, dry_run, replay))
        if dropped:
            told = (*change.effect.notes, self._dropped(dropped))
            change = replace(change, effect=replace(change.effect, notes=told))
        return change

    def _atomically(
        self,
        target: edits.BoundModel,
        apply: Callable[[Transaction], Change],
        dry_run: bool,
        replay: Replay | None = None,
    ) -> tuple[Change, int]:
        """``apply`` in a transaction, then recorded (the commit point) and settled; or
        rolled back. Returns the change and how many old records the history dropped."""
        tx = Transaction()
        try:
            change = apply(tx)
            if dry_run or change.unchanged:  # nothing to keep: no history entry to undo
                tx.revert()
                return change, 0
            dropped = self._history.push(
                change,
                target.model,
                target.optimizer,
                tx,
                self.config.history_limit,
                self.history_cap().nbytes,
                replay,
            )
            self._settle(target, tx)
            return change, dropped
        except BaseException:
            # recorded means applied: finish it; otherwise it never happened
            if self._history.holds(tx):
                self._settle(target, tx)
            else:
                tx.revert()
            raise

    def _settle(self, target: edits.BoundModel, tx: Transaction) -> None:
        """What follows a command's commit point; idempotent, so an interrupted one is
        simply run again."""
        tx.commit()
        self.workspace.current = target.model_name
        if target.optimizer_name is not None:
            self.workspace.remember(target.model_name, target.model, target.optimizer_name)

    def history_cap(self) -> ByteCap:
        """The bytes the undo history may keep alive, and why that many."""
        return byte_cap(self.config.history_bytes, machine_memory()[1])

    def _dropped(self, n: int) -> str:
        cap = self.history_cap()
        return (
            f"undo history full: the oldest {n} command{'s' if n > 1 else ''} can no longer "
            f"be undone (history_limit {self.config.history_limit} commands; history_bytes "
            f"{cap.nbytes} bytes, {cap.reason})"
        )

    # -- surgery ---------------------------------------------------------------------

    def freeze(
        self,
        *targets: str,
        exclude: Sequence[str] = (),
        bn: str | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Stop training ``targets``: requires_grad off, out of the optimizer (state set
        aside for undo), BatchNorm per policy. No targets means the whole model."""
        policy = _checked_bn(bn or self.config.bn_policy)
        target, selection = self._selection(targets, exclude, optimizer)
        return self._run(
            "freeze",
            command or _call("freeze", *targets, exclude=tuple(exclude) or None, bn=bn),
            target,
            dry_run,
            lambda tx: edits.freeze(target, selection, policy, tx),
            self._replay("freeze", targets, exclude, bn=policy),
        )

    def unfreeze(
        self,
        *targets: str,
        lr: LrSpec = None,
        wd: float | None = None,
        exclude: Sequence[str] = (),
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Train ``targets`` again, each block in its own named param group.

        ``lr`` is a float, or ``(first, last)`` for a geometric spread over the blocks in
        module order; without it, ``unfreeze_lr_ratio`` × the head group's lr. ``wd``
        overrides weight decay for the new groups.
        """
        lr_spec = _checked_lr(lr)
        weight_decay = None if wd is None else check_positive(wd, "wd", allow_zero=True)
        target, selection = self._selection(targets, exclude, optimizer)
        lrs = spread_lrs(lr_spec, len(selection.blocks))
        return self._run(
            "unfreeze",
            command or _call("unfreeze", *targets, lr=lr, wd=wd, exclude=tuple(exclude) or None),
            target,
            dry_run,
            lambda tx: edits.unfreeze(
                target, selection, lrs, weight_decay, self.config.unfreeze_lr_ratio, tx
            ),
            self._replay(
                "unfreeze",
                targets,
                exclude,
                lr=lr_spec,
                wd=weight_decay,
            ),
        )

    def replace_head(
        self,
        where: str | None,
        num_classes: int | None = None,
        *,
        dropout: float | None = None,
        labels: Sequence[str] | None = None,
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
        if num_classes is None:
            if labels is None:
                raise TorchMagicError(
                    "the class count is missing: give num_classes (or labels)",
                    param="num_classes",
                )
            num_classes = len(labels)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise TorchMagicError(
                f"num_classes must be a positive integer, got {num_classes!r}",
                param="num_classes",
            )
        target, root_name, root = self._one_module(None if where == "auto" else where, optimizer)
        return self._run(
            "replace_head",
            command or _call("replace_head", where or "auto", num_classes, dropout=dropout),
            target,
            dry_run,
            lambda tx: edits.replace_head(
                target, root, root_name, num_classes, dropout, tx, labels
            ),
            Replay(
                "replace_head",
                (root_name,),
                _options(
                    num_classes=num_classes,
                    dropout=dropout,
                    labels=None if labels is None else tuple(labels),
                ),
            ),
        )

    def lora(
        self,
        *targets: str,
        r: int = 8,
        alpha: float = 16,
        dropout: float = 0.0,
        lr: float | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Low-rank adapters (peft's LoRA layers, rank ``r``, scale ``alpha / r``) on the
        Linear / Conv2d / Embedding layers ``targets`` name or contain, in place: their base weights
        stop training and leave the optimizer, the adapters train in a new ``lora`` group
        at base lr ``lr`` (default: the head group's base lr). See ``core.surgery.lora``."""
        if not targets:
            raise TorchMagicError("name the layers to adapt", param="targets")
        lr = None if lr is None else check_positive(lr, "lr")
        lora.check_options(r, alpha, dropout)
        target, selection = self._selection(targets, (), optimizer)
        return self._run(
            "lora",
            command or _call("lora", *targets, r=r, alpha=alpha, dropout=dropout, lr=lr),
            target,
            dry_run,
            lambda tx: lora.add(target, selection, r, alpha, dropout, lr, tx),
            self._replay("lora", targets, (), r=r, alpha=alpha, dropout=dropout, lr=lr),
        )

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
        target = self._lora_target(model, optimizer)
        return self._run(
            "merge_lora",
            command or _call("merge_lora", model=model),
            target,
            dry_run,
            lambda tx: lora.merge(target, tx),
            Replay("merge_lora", (), ()),
        )

    def lora_off(self, model: str | None = None, *, command: Command | None = None) -> Change:
        """The (current) model without its LoRA adapters' contribution (kept, not merged)."""
        return self._lora_switch(model, False, command or _call("lora_off", model=model))

    def lora_on(self, model: str | None = None, *, command: Command | None = None) -> Change:
        """The LoRA adapters switched off by :meth:`lora_off` contribute again."""
        return self._lora_switch(model, True, command or _call("lora_on", model=model))

    def _lora_target(self, model: str | None, optimizer: str | None) -> edits.BoundModel:
        target = self.bound(model, optimizer)
        model_checks.check_editable(target.model, target.model_name)
        return target

    def _lora_switch(self, model: str | None, on: bool, command: Command) -> Change:
        target = self._lora_target(model, None)
        action = "lora_on" if on else "lora_off"
        return self._run(
            action,
            command,
            target,
            False,
            lambda tx: lora.switch(target, on, tx),
            Replay(action, (), ()),
        )

    def summary(
        self,
        where: str | None = None,
        depth: int | None = None,
        input_shape: Sequence[int] | None = None,
    ) -> SummaryReport:
        """A bounded table of the model (or a sub-tree) with trainable state and groups;
        with ``input_shape`` (batch first, ``(1, 3, 224, 224)``) each module's output shape
        and bytes too, from one forward on the meta device (no memory, no arithmetic)."""
        if depth is not None and depth < 0:
            raise TorchMagicError(f"depth must be >= 0, got {depth}", param="depth")
        target, relative_name, root = self._one_module(where, reading=True)
        label = f"{target.model_name}.{relative_name}" if relative_name else target.model_name
        return summarize(
            root,
            model_name=label,
            optimizer=target.optimizer,
            optimizer_name=target.optimizer_name,
            schedulers=target.schedulers,
            scheduler_names=target.names,
            depth=self.config.summary_depth if depth is None else depth,
            max_rows=self.config.summary_max_rows,
            input_shape=input_shape,
        )

    # -- session ---------------------------------------------------------------------

    def _stale(self, record: Record) -> str:
        """Why ``record`` can no longer be undone ("" while it can): its model is not bound
        to its variable any more, or the optimizer it edited was re-created."""
        bound = self.workspace.module(record.change.model_name)
        model = record.model()
        if model is None or bound is None or unwrap(bound) is not model:
            return REBOUND
        if record.optimizer is not None:
            now = self.workspace.optimizer(record.change.optimizer_name or "")
            if now is not record.optimizer():
                return "optimizer re-created"
        return ""

    def prune_history(self) -> None:
        """Release the undo logs of commands whose model was rebound or whose optimizer
        was re-created: they cannot be undone, and would keep the old objects (and state
        set aside) alive. The notebook calls this after every cell."""
        self._history.release(self._stale)

    def history(self) -> tuple[HistoryEntry, ...]:
        """Every command so far, oldest first; stale entries can no longer be undone."""
        self.prune_history()
        return self._history.entries()

    def history_bytes(self, device_type: str | None = None) -> int:
        """Bytes of tensors the undo history keeps alive (on ``device_type``, or all)."""
        self.prune_history()
        return self._history.nbytes(device_type)

    def clear_history(self) -> Cleared:
        """Forget every command: nothing can be undone afterwards, and what the undo
        logs kept alive (optimizer state set aside, replaced layers) is released."""
        return self._history.clear()

    def _refuse_undo(self, record: Record) -> None:
        """Refuse, before anything changes, an undo that would leave the model and its
        live optimizer inconsistent."""
        command = spelled(record.change.command)
        fix = "make the opposite change instead, or clear the history"
        if record.stale == REPLAYED:
            raise TorchMagicError(
                f"cannot undo {command}: it was replayed from a checkpoint, and resumed "
                "commands cannot be undone"
            )
        if record.tx is None:
            raise TorchMagicError(
                f"cannot undo {command}: the optimizer it edited, "
                f"'{record.change.optimizer_name}', was re-created since, and undoing would "
                f"make parameters trainable that the new one does not hold; {fix}"
            )
        if record.optimizer is None:
            model = record.model()
            assert model is not None  # bound: not stale
            name, now = self.workspace.resolve_optimizer(record.change.model_name, model)
            if now is not None:
                held = {id(p) for g in now.param_groups for p in g["params"]}
                missing = sum(id(p) not in held for p in record.tx.trains_after_undo)
                kept = sum(id(p) in held for p in record.tx.stops_after_undo)
                if missing or kept:
                    what = (
                        f"make {missing} parameter tensors trainable that it does not hold"
                        if missing
                        else f"leave {kept} parameter tensors in it that would no longer train"
                    )
                    raise TorchMagicError(
                        f"cannot undo {command}: it ran without an optimizer and '{name}' "
                        f"holds the model's parameters now; undoing would {what}; {fix}"
                    )
        reason = record.tx.refusal()
        if reason:
            raise TorchMagicError(f"cannot undo {command}: {reason}; {fix}")

    def undone(self) -> tuple[Command, ...]:
        """The commands :meth:`undo` reverted, oldest first."""
        return tuple(self._history.undone)

    def undo(self) -> Change:
        """Revert the newest command still applying to a bound model; atomic like the
        commands (under Ctrl-C too): reverted and out of the history, or neither."""
        self.prune_history()
        record = self._history.newest()
        self._refuse_undo(record)
        tx = record.tx
        assert tx is not None  # checked by _refuse_undo
        model = record.model()
        assert model is not None  # bound, so alive
        opt = None if record.optimizer is None else record.optimizer()

        def revert() -> tuple[Counts, dict]:
            measured = count(model), group_keys(opt)
            tx.revert()  # its first inverse takes the record out of the history
            return measured

        before, groups_before = uninterrupted(revert)
        return replace(
            record.change,
            effect=Effect(record.change.effect.modules, record.change.effect.params),
            action="undo",
            command=("undo ", *as_advice(record.change.command)),
            before=before,
            after=count(model),
            groups=describe_groups(
                opt,
                groups_before,
                self.workspace.schedulers(opt) if opt is not None else (),
                self.workspace.names(),
            ),
        )

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
        check_binding(bind, self.workspace.namespace)
        loaded = build_model(name, weights)
        namespace = self.workspace.namespace
        namespace[bind] = loaded.model
        namespace["weights"] = loaded.weights
        namespace["preprocess"] = loaded.preprocess
        namespace["categories"] = list(loaded.categories) if loaded.categories else None
        self.loaded[bind] = loaded
        self.workspace.current = bind
        if num_classes is None:
            return loaded, None
        return loaded, self.replace_head(bind, num_classes, command=head_command)

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
        return diagnose(
            self.workspace.namespace,
            hidden=self.workspace.hidden,
            amp=self.amp,
            compile_watch=self.compile_watch,
            device=self.device,
            weights=self.loaded,
            replaced_heads={e.model_name for e in self.history() if e.action == "replace_head"},
            fits=self.fits,
            pinbench=self.last_pinbench,
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
        target = self.bound(model)
        payload = checkpoint.capture(
            target,
            self._history.applied(target.model),
            self.amp,
            python_call,
            __version__,
        )
        nbytes = checkpoint.write(payload, path, sync=sync)
        return checkpoint.summarize_save(payload, os.fspath(path), nbytes, synced=sync)

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
        where = os.fspath(path)
        payload = checkpoint.read(where)
        target = self.bound(model, optimizer)
        device_type = self.model_device(target.model).type
        calls = list(checkpoint.replays(payload))
        already = len(self._history.applied(target.model))
        checkpoint.check_fresh(payload, where, target, device_type, already)
        replayed = 0
        try:
            for command, call in calls:
                self._replay_call(target, call, command)
                replayed += 1
            checkpoint.check_replayed(payload, where, target)
        except BaseException as exc:  # a refusal, a bug or Ctrl-C: the replay is undone
            for _ in range(replayed):
                self.undo()
            if not isinstance(exc, TorchMagicError) or str(exc).startswith("cannot resume"):
                raise
            raise TorchMagicError(
                f"cannot resume from '{where}': replaying {calls[replayed][0]} failed: {exc}; "
                "nothing was changed"
            ) from None
        self._history.seal_replayed(replayed)
        checkpoint.load_states(payload, target)
        checkpoint.load_precision(payload, self.amp, device_type, scaler)
        checkpoint.load_rng(payload)
        self.workspace.current = target.model_name
        return checkpoint.summarize_resume(payload, where, target)

    def _replay_call(self, target: edits.BoundModel, call: Replay, command: str) -> None:
        """One saved command, on ``target`` whatever its variable is called."""
        name, opt = target.model_name, target.optimizer_name
        options = call.kwargs()

        def on_model(paths: Sequence[str]) -> list[str]:
            return [f"{name}.{p}" if p else name for p in paths] or [name]

        if call.method == "set_base_lrs":
            lrs = dict(options["lrs"])
            self.set_base_lrs(lrs, model=name, optimizer=opt, command=command)
        elif call.method == "lora":
            self.lora(*on_model(call.targets), optimizer=opt, command=command, **options)
        elif call.method == "merge_lora":
            self.merge_lora(name, optimizer=opt, command=command)
        elif call.method in ("lora_off", "lora_on"):
            getattr(self, call.method)(name, command=command)
        elif call.method == "replace_head":
            root = call.targets[0] if call.targets else ""
            labels = options.get("labels")
            self.replace_head(
                f"{name}.{root}" if root else name,
                options["num_classes"],
                dropout=options.get("dropout"),
                labels=None if labels is None else list(labels),
                optimizer=opt,
                command=command,
            )
        else:
            exclude = [f"{name}.{p}" for p in options.pop("exclude", ())]
            method = self.freeze if call.method == "freeze" else self.unfreeze
            method(
                *on_model(call.targets), exclude=exclude, optimizer=opt, command=command, **options
            )

    def export(self, path: str | os.PathLike, model: str | None = None) -> ExportReport:
        """Write the (current) model's commands as a Python script of Session calls, fits
        included, with a header naming the variables it expects (see ``core.export``)."""
        target = self.bound(model, reading=True)
        fits = [f for f in self._fit_calls if f[0]() is target.model]
        made_by_fits = {
            e.index
            for e in self._history.applied(target.model)
            for _, before, after, _ in fits
            if before < e.index <= after
        }
        steps: list[tuple[tuple[int, int], str, str]] = [
            ((e.index, 0), python_call(e.replay), spelled(e.command))
            for e in self._history.applied(target.model)
            if e.replay is not None and e.index not in made_by_fits
        ]
        loaders: dict[str, str] = {}
        for _, before, _, call in fits:
            names = {k: str(v) for k, v in call.options if k in ("train", "val")}
            loaders.update({v: f"batches for tm.fit ({k})" for k, v in names.items()})
            steps.append(((before, 1), python_call(call, names), ""))
        steps.sort(key=lambda s: s[0])
        variables = [(target.model_name, type(target.model).__name__)]
        session_args = [target.model_name]
        if target.optimizer is not None:
            variables.append(
                (target.optimizer_name or "optimizer", type(target.optimizer).__name__)
            )
            session_args.append(target.optimizer_name or "optimizer")
        scheduler_names = [
            (self._name_of(s, f"scheduler{i}"), type(s).__name__)
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
        write_text(text, path)
        return ExportReport(os.fspath(path), tuple(variables), len(steps))

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
        for p in model.parameters():
            return p.device
        return torch.device("cpu")

    def device_type(self, model: str | None = None) -> str:
        """The session's device type, else that of the (current) model's parameters,
        else (no model yet) that of the best device available."""
        if self.device is not None:
            return self.device.type
        if model is None and not self.workspace.models():
            return resolve_device("auto").type
        _, module = self.workspace.resolve_model(model)
        return self.model_device(unwrap(module)).type

    def move(self, model: str | None = None) -> MoveReport:
        """Move the (current) model with its optimizer state and the GradScaler to the
        session's device (chosen automatically when none is set), keeping every
        Parameter object; that device becomes the session's."""
        bound = self.bound(model)
        target = self.device or resolve_device("auto")
        report = move_model(
            bound.model, target, bound.optimizer, self.amp.scaler, model_name=bound.model_name
        )
        self.device = target
        return report

    def check(self, model: str | None = None) -> CheckReport:
        """Tensors of the (current) model, its optimizer and the GradScaler that are not
        where the model's parameters are, each with its fix; changes nothing."""
        bound = self.bound(model, reading=True)
        return find_misplaced(
            bound.model,
            bound.optimizer,
            self.amp.scaler,
            model_name=bound.model_name,
            optimizer_name=bound.optimizer_name or "optimizer",
        )

    def pinbench(self, loader: object) -> PinReport:
        """Time pageable against pinned host→device copies of one batch of ``loader``
        (a variable name, a DataLoader, any iterable of batches, or a batch)."""
        self.last_pinbench = time_host_copies(self._variable(loader, "loader"), self.device)
        return self.last_pinbench

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
        bound = self.bound(model, optimizer)
        return compare(
            bound.model,
            self._loader(loader, "loader"),
            bound.optimizer,
            loss_fn=resolve_loss(loss, self.workspace.namespace),
            steps=steps,
            model_name=bound.model_name,
        )

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
        effective_batch = check_effective_batch(effective_batch)
        bound = self.bound(model, optimizer)
        report = find_batch_size(
            bound.model,
            bound.optimizer,
            tuple(input_shape),
            budget=budget,
            max_batch=max_batch,
            amp_dtype=self.amp.dtype if self.amp.enabled else None,
        )
        return replace(report, effective_batch=effective_batch)

    def memory(self, model: str | None = None) -> MemoryReport:
        """Memory in use on the (current) model's device, broken down into parameters,
        gradients, optimizer state and the rest; the device figures alone when no model
        is named and none can be found."""
        namespace = self.workspace.namespace
        try:
            bound = self.bound(model, reading=True)
        except TorchMagicError:
            if model is not None:
                raise
            report = breakdown(None, namespace=namespace)
        else:
            report = breakdown(
                bound.model, bound.optimizer, model_name=bound.model_name, namespace=namespace
            )
        return replace(report, history_bytes=self.history_bytes("cpu"))

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
        bound = self.bound(model)
        return estimate_step(
            bound.model,
            optimizer_class or bound.optimizer,
            None if input_shape is None else tuple(input_shape),
            model_name=bound.model_name,
            amp_dtype=self.amp.dtype if self.amp.enabled else None,
        )

    # -- mixed precision -------------------------------------------------------------

    def amp_status(self) -> AmpStatus:
        """The precision policy: off, or autocast dtype and device type, with the scaler."""
        return self.amp.status()

    def amp_on(self, mode: str = "auto", model: str | None = None) -> AmpStatus:
        """Autocast for training on the session's device (else the current model's):
        ``mode`` is ``"auto"`` (bf16 where supported), ``"bf16"`` or ``"fp16"`` (with a
        GradScaler)."""
        return self.amp.turn_on(self.device_type(model), mode)

    def amp_off(self) -> AmpStatus:
        """Plain precision again; an fp16 GradScaler's state is kept for next time."""
        return self.amp.turn_off()

    def autocast(self, mode: str | None = None) -> AbstractContextManager:
        """``with tm.autocast():`` around forward and loss in a hand-written loop (the
        session's policy); with ``mode``, that precision for this block only, on the
        session's device type, leaving the policy as it is."""
        if mode is None:
            return self.amp.autocast()
        return cell_autocast(self.amp, mode, self.device_type())

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
        window = self._windows.get(optimizer)
        if window is None or (window.every, window.clip) != (accumulate, clip):
            fresh = Accumulation(accumulate, clip)  # checks both
            if window is not None and window.pending:
                raise TorchMagicError(
                    f"{window.pending} of {window.every} batches of this optimizer's window "
                    f"are accumulated with accumulate={window.every}, clip={window.clip}: "
                    "finish it (last=True) before changing them",
                    param="accumulate",
                )
            window = self._windows[optimizer] = fresh
        return window.add(loss, optimizer, self.amp.active_scaler, last=last)

    # -- training --------------------------------------------------------------------

    def _loader(self, value: object, param: str) -> Iterable:
        value = self._variable(value, param)
        if not isinstance(value, Iterable):
            raise TorchMagicError(
                f"{param} must be an iterable of batches, got {type(value).__name__}",
                param=param,
            )
        return value

    def _fit_plan(
        self,
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
        name, module = self.workspace.resolve_model(model)
        target = self._target(name, module, optimizer)
        if target.optimizer is None:
            stale = self.workspace.stale_optimizers()
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
        device = self.model_device(target.model)
        if self.device is not None and self.device != device:
            raise TorchMagicError(
                f"'{name}' is on {device} but the session device is {self.device}; "
                "move it there first"
            )
        if self.amp.enabled and self.amp.device_type != device.type:
            raise TorchMagicError(
                f"AMP is on for {self.amp.device_type} but '{name}' is on {device.type}; "
                f"turn AMP on again for {device.type}"
            )
        plan = FitPlan(
            model=target.model,
            model_name=name,
            optimizer=target.optimizer,
            schedulers=scheduler_sync.roots(target.schedulers) + list(self._phase_schedulers),
            loss_fn=resolve_loss(loss, self.workspace.namespace),
            device=device,
            amp=self.amp,
            train=self._loader(train, "train"),
            val=None if val is None else self._loader(val, "val"),
            label=label,
        )
        return target, plan

    def fit(
        self,
        train: object,
        *,
        model: str | None = None,
        val: object | None = None,
        epochs: int = 1,
        max_steps: int | None = None,
        loss: str | Callable = "cross_entropy",
        cache_features: bool = False,
        optimizer: str | None = None,
        observer: FitObserver | None = None,
        sched_step: SchedStep | None = None,
        unfreeze: Sequence[str] | str = (),
        every: int | None = None,
        patience: int | None = None,
        lr_ratio: float = 0.3,
        monitor: Monitor = "loss",
        early_stop: bool = False,
        keep_best: bool = False,
        accumulate: int = 1,
        clip: float | None = None,
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
        validation ``monitor`` ("loss" or "acc"), the k-th at the base lr of the one
        before × ``lr_ratio`` (the first: the head group's × ``lr_ratio``), each through
        :meth:`unfreeze` (a history entry). ``early_stop`` ends the run when the last
        block is unfrozen and the metric stalls for ``patience`` (else ``every``) more
        epochs; ``keep_best`` loads the best epoch's weights back at the end (one host
        copy of the ``state_dict``).
        """
        target, plan = self._fit_plan(
            train,
            model=model,
            val=val,
            loss=loss,
            optimizer=optimizer,
            label=f"fit {len(self.fits) + 1}",
        )
        plan.epochs, plan.max_steps = epochs, max_steps
        plan.cache_features, plan.sched_step = cache_features, sched_step
        plan.accumulate, plan.clip = accumulate, clip
        blocks = unfreeze.split(",") if isinstance(unfreeze, str) else list(unfreeze)
        blocks = [b.strip() for b in blocks if b.strip()]
        if blocks or every is not None or patience is not None or early_stop or keep_best:
            plan.pacing = self._pacing(
                target,
                plan,
                Pacing(tuple(blocks), every, patience, lr_ratio, monitor, early_stop, keep_best),
                optimizer,
            )
        elif monitor != "loss":
            check_pacing(Pacing(monitor=monitor), plan.val is not None, cache_features)
        if observer is not None:
            plan.observer = observer
        before = self._newest_command(target.model)
        history = run_fit(plan)
        self.fits.append(history)
        self.workspace.current = target.model_name
        call = Replay(
            "fit",
            (),
            _options(
                train=self._name_of(train, "train_loader"),
                val=None if val is None else self._name_of(val, "val_loader"),
                epochs=epochs,
                max_steps=max_steps,
                loss=loss if isinstance(loss, str) and loss != "cross_entropy" else None,
                cache_features=cache_features or None,
                sched_step=sched_step,
                unfreeze=tuple(blocks) or None,
                every=every,
                patience=patience,
                lr_ratio=lr_ratio if plan.pacing is not None and lr_ratio != 0.3 else None,
                monitor=None if monitor == "loss" else monitor,
                early_stop=early_stop or None,
                keep_best=keep_best or None,
            ),
        )
        after = self._newest_command(target.model)
        self._fit_calls.append((weakref.ref(target.model), before, after, call))
        return history

    def _newest_command(self, model: nn.Module) -> int:
        applied = self._history.applied(model)
        return applied[-1].index if applied else 0

    def _name_of(self, value: object, default: str) -> str:
        """The variable ``value`` is bound to (itself when it is a name), else ``default``."""
        if isinstance(value, str):
            return value
        return next((n for n, v in self.workspace.items() if v is value), default)

    def _head_base_lr(self, target: edits.BoundModel) -> float:
        """The base lr of the group training the head (now)."""
        ref = edits.head_group(target)
        return base_lrs(target.optimizer, target.schedulers)[0 if ref is None else ref]  # type: ignore[arg-type]

    def _pacing(
        self, target: edits.BoundModel, plan: FitPlan, pacing: Pacing, optimizer: str | None
    ) -> Pacing:
        """``pacing`` with the session's hooks, after checking every block: it names
        modules of the model, holds frozen parameters no earlier block takes, and a dry
        run of its unfreeze passes (schedulers followable…)."""
        check_pacing(pacing, plan.val is not None, plan.cache_features)
        name = target.model_name

        def head_base_lr() -> float:
            return self._head_base_lr(self._target(name, target.model, optimizer))

        def unfreeze_block(block: str, lr: float, epoch: int) -> None:
            self.unfreeze(
                name,
                block,
                lr=lr,
                optimizer=optimizer,
                command=(
                    *_call("unfreeze", f"{name}.{block}", lr=lr),
                    f" ({plan.label}, after epoch {epoch})",
                ),
            )

        claimed: set[int] = set()
        first_lr = head_base_lr() * pacing.lr_ratio if pacing.blocks else 0.0
        for block in pacing.blocks:
            _, selection = self._selection((name, block), (), optimizer)
            frozen = [
                p for p in selection.parameters() if not p.requires_grad and id(p) not in claimed
            ]
            if not frozen:
                raise TorchMagicError(
                    f"'{block}' has no frozen parameters left to unfreeze", param="unfreeze"
                )
            claimed.update(id(p) for p in frozen)
            self.unfreeze(name, block, lr=first_lr, optimizer=optimizer, dry_run=True)
        return replace(pacing, unfreeze=unfreeze_block, head_base_lr=head_base_lr)

    def lr_find(
        self,
        train: object,
        *,
        model: str | None = None,
        start: float = 1e-7,
        end: float = 10.0,
        steps: int = 100,
        apply: bool = False,
        optimizer: str | None = None,
        observer: FitObserver | None = None,
        loss: str | Callable = "cross_entropy",
    ) -> LrFindResult:
        """The lr range test on what is trainable now (see ``core.training.lr_find``):
        every group's lr grows together from ``start`` to ``end`` over ``steps`` steps,
        ratios kept; afterwards everything is as before, bit for bit. ``apply`` sets the
        head group's base lr to the suggestion, the other groups' in proportion, as one
        history entry (undoable). Each step is one batch, never accumulated: with
        ``fit(accumulate=N)`` each loss is divided by N, so a step's gradient has the same
        scale and the suggestion carries over."""
        check_range(start, end, steps)
        target, plan = self._fit_plan(
            train, model=model, val=None, loss=loss, optimizer=optimizer, label="lr_find"
        )
        if observer is not None:
            plan.observer = observer
        assert target.optimizer is not None
        bases = base_lrs(target.optimizer, target.schedulers)
        ref = edits.head_group(target)
        ref = 0 if ref is None else ref
        result = find_lr(plan, start=start, end=end, steps=steps, reference=ref, bases=bases)
        if not apply or result.suggestion is None:
            return result
        suggestion = result.suggestion
        new = {
            i: suggestion * r
            for i, (b, r) in enumerate(zip(bases, result.ratios, strict=True))
            if b > 0
        }
        group = result.reference_name
        change = self.set_base_lrs(
            new,
            model=target.model_name,
            optimizer=optimizer,
            command=(
                *_call("lr_find", apply=True),
                f": base lr {suggestion:.3g} for {'group ' * group.isdigit()}{group}, "
                "others in proportion",
            ),
        )
        return replace(result, applied=change)

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
        target = self.bound(model, optimizer)
        lrs = dict(lrs)
        return self._run(
            "set_lr",
            command or _call("set_base_lrs", lrs=lrs),
            target,
            False,
            lambda tx: set_base_lrs(target, lrs, tx),
            Replay("set_base_lrs", (), (("lrs", tuple(sorted(lrs.items()))),)),
        )

    def fine_tune(
        self,
        train: object,
        *,
        val: object,
        epochs: int,
        freeze_epochs: int = 1,
        lr: float | None = None,
        model: str | None = None,
        loss: str | Callable = "cross_entropy",
        optimizer: str | None = None,
        observer: FitObserver | None = None,
        sched_step: SchedStep | None = None,
        accumulate: int = 1,
        clip: float | None = None,
        schedule: str | None = None,
        bn: str | None = None,
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
        bound to the optimizer. After each run every group's lr is its base lr again."""
        for what, value in (("epochs", epochs), ("freeze_epochs", freeze_epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TorchMagicError(f"{what} must be at least 1, got {value!r}", param=what)
        if lr is not None and not (
            isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < float("inf")
        ):
            raise TorchMagicError(f"lr must be a positive number, got {lr!r}", param="lr")
        if bn is not None:
            _checked_bn(bn)
        target, plan = self._fit_plan(
            train, model=model, val=val, loss=loss, optimizer=optimizer, label=""
        )
        plan.accumulate, plan.clip = accumulate, clip
        check_plan(plan)
        steps_per_epoch = self._one_cycle_steps(schedule, target, plan)
        name = target.model_name
        head = heads.find_head(target.model).name
        blocks = fine_tune_blocks(target.model)
        if not head or not blocks:
            raise TorchMagicError(
                f"'{name}' is a single layer: there is no body to fine-tune", param="model"
            )
        runs = {
            "train": train,
            "model": name,
            "val": val,
            "loss": loss,
            "optimizer": optimizer,
            "observer": observer,
            "sched_step": sched_step,
            "accumulate": accumulate,
            "clip": clip,
        }
        opt = target.optimizer
        assert opt is not None
        freeze = self.freeze(name, exclude=(head,), bn=bn, optimizer=optimizer)
        with self._phase(opt, HEAD_PHASE, freeze_epochs * steps_per_epoch):
            head_fit = self.fit(epochs=freeze_epochs, **runs)  # type: ignore[arg-type]
        result = FineTuneResult(name, 0.0, blocks, freeze, head_fit, schedule=schedule, bn=bn)
        if head_fit.stop_reason in (StopReason.INTERRUPTED, StopReason.NON_FINITE_LOSS):
            return result
        top = (
            lr
            if lr is not None
            else self._head_base_lr(self._target(name, target.model, optimizer))
        )
        unfreeze = self.unfreeze(name, *blocks, lr=(top / 100, top), optimizer=optimizer)
        with self._phase(opt, UNFROZEN_PHASE, epochs * steps_per_epoch):
            full_fit = self.fit(epochs=epochs, **runs)  # type: ignore[arg-type]
        return replace(result, lr=top, unfreeze=unfreeze, full_fit=full_fit)

    def _one_cycle_steps(
        self, schedule: str | None, target: edits.BoundModel, plan: FitPlan
    ) -> int:
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
        self, optimizer: torch.optim.Optimizer, phase: OneCyclePhase, total_steps: int
    ) -> Iterator[None]:
        """fine_tune's run under its own OneCycleLR (``total_steps`` 0: no schedule)."""
        if not total_steps:
            yield
            return
        with one_cycle_phase(optimizer, phase, total_steps) as scheduler:
            self._phase_schedulers = (scheduler,)
            try:
                yield
            finally:
                self._phase_schedulers = ()


def _checked_bn(policy: str) -> str:
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


def _call(action: str, *args: str | int, **kwargs: object) -> Advice:
    """The command as the session call that did it, for the history; each front end
    spells it (``tm.freeze("layer1")``, ``%freeze layer1``)."""
    options = tuple((key, value) for key, value in kwargs.items() if value is not None)
    return (Call(action, args, options),)


def _options(**options: object) -> tuple[tuple[str, object], ...]:
    """Keyword arguments of a replay, those left at None dropped."""
    return tuple((k, v) for k, v in options.items() if v is not None)


def _relative_text(target: Target) -> str:
    """A target relative to its model, as text the grammar parses again ("" : the model)."""
    if target.glob is not None:
        return target.glob
    return ".".join(segment.text for segment in target.segments)


def resume(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    schedulers: Sequence[object] = (),
    scaler: torch.amp.GradScaler | None = None,
) -> Session:
    """A Session over ``model`` and ``optimizer`` (built the way the notebook first built
    them, e.g. ``resnet18(num_classes=10)``, ``AdamW(model.parameters())``) and its
    ``schedulers``, continued from the :meth:`Session.save` file at ``path``: the saved
    commands replayed, every state loaded by name. Refused in one line, with nothing
    changed, when anything does not match."""
    session = Session(model, optimizer, schedulers=schedulers)
    session.load(path, scaler=scaler)
    return session
