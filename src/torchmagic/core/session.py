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

from collections.abc import Callable, Container, Iterable, MutableMapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import torch
from torch import nn

from . import distributed
from .devices.batch_size import BatchSizeReport, find_batch_size
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
from .modules import unwrap
from .surgery import edits, heads, model_checks, scheduler_sync
from .surgery.base_lrs import base_lrs, set_base_lrs
from .surgery.batchnorm import POLICIES
from .surgery.counting import count, describe_groups, group_keys
from .surgery.grammar import LrSpec, check_positive, parse_targets, spread_lrs
from .surgery.history import REBOUND, ByteCap, Cleared, History, Record, byte_cap
from .surgery.results import Change, Counts, Effect, HistoryEntry, SummaryReport
from .surgery.selection import resolve, select
from .surgery.summary import summarize
from .surgery.transaction import Transaction, uninterrupted
from .training.amp import AmpController, AmpStatus, cell_autocast
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
from .training.recipe import FineTuneResult, fine_tune_blocks
from .training.schedule_steps import SchedStep
from .workspace import StaleOptimizerError, Workspace
from .zoo import LoadedModel
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

    # -- resolving -------------------------------------------------------------------

    def _target(
        self, name: str, model: nn.Module, optimizer: str | None, reading: bool = False
    ) -> edits.BoundModel:
        """``model`` with its optimizer and schedulers. An optimizer holding none of its
        parameters is refused; ``reading`` (commands that only show) treats it as none."""
        try:
            opt_name, opt = self.workspace.resolve_optimizer(name, unwrap(model), optimizer)
        except StaleOptimizerError:
            if not reading:
                raise
            opt_name, opt = None, None
        scheds = self.workspace.schedulers(opt) if opt is not None else []
        return edits.BoundModel(unwrap(model), name, opt, opt_name, scheds)

    def bound(
        self, model: str | None = None, optimizer: str | None = None, *, reading: bool = False
    ) -> edits.BoundModel:
        """The named (or current) model with the optimizer and schedulers bound to it;
        ``reading``: for a command that only shows, so a stale optimizer counts as none."""
        name, module = self.workspace.resolve_model(model)
        return self._target(name, module, optimizer, reading)

    def _selection(self, targets: Sequence[str], exclude: Sequence[str], optimizer: str | None):
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
            raise TorchMagicError(f"'{where}' names {len(hits)} modules; name one", param="where")
        return target, hits[0][0], hits[0][1]

    def _variable(self, value: object, param: str) -> object:
        """``value``, or the object bound to it when it is a variable name."""
        if not isinstance(value, str):
            return value
        if value not in self.workspace.namespace:
            raise TorchMagicError(f"no variable named '{value}' for {param}", param=param)
        return self.workspace.namespace[value]

    # -- running ---------------------------------------------------------------------

    def _run(
        self,
        action: str,
        command: str,
        target: edits.BoundModel,
        dry_run: bool,
        step: Callable[[Transaction], Effect],
    ) -> Change:
        """Run ``step`` as one atomic command: applied and in the history, or not at all
        (also under Ctrl-C, which waits until the end)."""
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
                groups=describe_groups(target.optimizer, groups_before, target.schedulers),
                dry_run=dry_run,
                unchanged=edits.fingerprint(target) == state_before,
            )

        change, dropped = uninterrupted(lambda: self._atomically(target, apply, dry_run))
        if dropped:
            notes = (*change.effect.notes, self._dropped(dropped))
            change = replace(change, effect=replace(change.effect, notes=notes))
        return change

    def _atomically(
        self, target: edits.BoundModel, apply: Callable[[Transaction], Change], dry_run: bool
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
        command: str | None = None,
    ) -> Change:
        """Stop training ``targets``: requires_grad off, out of the optimizer (state set
        aside for undo), BatchNorm per policy. No targets means the whole model."""
        policy = bn or self.config.bn_policy
        if policy not in POLICIES:
            raise TorchMagicError(f"bn={policy!r}: choose one of {', '.join(POLICIES)}", param="bn")
        target, selection = self._selection(targets, exclude, optimizer)
        return self._run(
            "freeze",
            command or _call("freeze", *targets, exclude=list(exclude) or None, bn=bn),
            target,
            dry_run,
            lambda tx: edits.freeze(target, selection, policy, tx),
        )

    def unfreeze(
        self,
        *targets: str,
        lr: LrSpec = None,
        wd: float | None = None,
        exclude: Sequence[str] = (),
        optimizer: str | None = None,
        dry_run: bool = False,
        command: str | None = None,
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
            command or _call("unfreeze", *targets, lr=lr, wd=wd, exclude=list(exclude) or None),
            target,
            dry_run,
            lambda tx: edits.unfreeze(
                target, selection, lrs, weight_decay, self.config.unfreeze_lr_ratio, tx
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
        command: str | None = None,
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
            command or _call("replace_head", where, num_classes, dropout=dropout),
            target,
            dry_run,
            lambda tx: edits.replace_head(
                target, root, root_name, num_classes, dropout, tx, labels
            ),
        )

    def summary(self, where: str | None = None, depth: int | None = None) -> SummaryReport:
        """A bounded table of the model (or a sub-tree) with trainable state and groups."""
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
            depth=self.config.summary_depth if depth is None else depth,
            max_rows=self.config.summary_max_rows,
        )

    # -- session ---------------------------------------------------------------------

    def _stale(self, record: Record) -> str:
        """Why ``record`` can no longer be undone ("" while it can): its model is not bound
        to its variable any more, or the optimizer it edited was re-created."""
        bound = self.workspace.namespace.get(record.change.model_name)
        model = record.model()
        if model is None or not isinstance(bound, nn.Module) or unwrap(bound) is not model:
            return REBOUND
        if record.optimizer is not None:
            now = self.workspace.namespace.get(record.change.optimizer_name or "")
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
        command = record.change.command
        fix = "make the opposite change instead, or clear the history"
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

    def undone(self) -> tuple[str, ...]:
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
            command=f"undo {record.change.command}",
            before=before,
            after=count(model),
            groups=describe_groups(
                opt, groups_before, self.workspace.schedulers(opt) if opt is not None else ()
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
    ) -> BatchSizeReport:
        """The largest batch of ``input_shape`` samples (no batch dimension) whose training
        step fits where the (current) model lives, under the session's AMP policy; on the
        CPU within ``budget`` bytes (default: the RAM available). State is restored."""
        bound = self.bound(model, optimizer)
        return find_batch_size(
            bound.model,
            bound.optimizer,
            tuple(input_shape),
            budget=budget,
            max_batch=max_batch,
            amp_dtype=self.amp.dtype if self.amp.enabled else None,
        )

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

    def step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> bool:
        """backward, (unscale) step, scaler update, zero_grad — correct under every
        precision policy; returns whether the optimizer stepped."""
        return self.amp.step(loss, optimizer)

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
            schedulers=scheduler_sync.roots(target.schedulers),
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
    ) -> FitHistory:
        """Train the (current) model on ``train`` with its optimizer, its schedulers and
        the AMP policy; returns the history, which the session also keeps in ``fits``.
        ``sched_step`` ("batch" or "epoch") steps every scheduler at that granularity
        instead of each one's own (see ``core.training.schedule_steps``).

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
        history = run_fit(plan)
        self.fits.append(history)
        self.workspace.current = target.model_name
        return history

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
                command=f"unfreeze {block} lr={lr:.3g} ({plan.label}, after epoch {epoch})",
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
        history entry (undoable)."""
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
        change = self._run(
            "set_lr",
            f"lr_find apply: base lr {suggestion:.3g} for {result.reference_name}, "
            "others in proportion",
            target,
            False,
            lambda tx: set_base_lrs(target, new, tx),
        )
        return replace(result, applied=change)

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
    ) -> FineTuneResult:
        """fastai's ``fine_tune`` as four of the session's own commands, each in the
        history: ``freeze(model, exclude=[head])``, ``fit(epochs=freeze_epochs)``,
        ``unfreeze(*blocks, lr=(lr / 100, lr))``, ``fit(epochs=epochs)``. The blocks are
        the model's top-level children holding parameters, head included (see
        ``core.training.recipe``); ``lr`` defaults to the head group's base lr after the
        first run. The observer sees both runs."""
        for what, value in (("epochs", epochs), ("freeze_epochs", freeze_epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TorchMagicError(f"{what} must be at least 1, got {value!r}", param=what)
        if lr is not None and not (
            isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < float("inf")
        ):
            raise TorchMagicError(f"lr must be a positive number, got {lr!r}", param="lr")
        target, plan = self._fit_plan(
            train, model=model, val=val, loss=loss, optimizer=optimizer, label=""
        )
        check_plan(plan)
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
        }
        freeze = self.freeze(name, exclude=(head,), optimizer=optimizer)
        head_fit = self.fit(epochs=freeze_epochs, **runs)  # type: ignore[arg-type]
        result = FineTuneResult(name, 0.0, blocks, freeze, head_fit)
        if head_fit.stop_reason in (StopReason.INTERRUPTED, StopReason.NON_FINITE_LOSS):
            return result
        top = (
            lr
            if lr is not None
            else self._head_base_lr(self._target(name, target.model, optimizer))
        )
        unfreeze = self.unfreeze(name, *blocks, lr=(top / 100, top), optimizer=optimizer)
        full_fit = self.fit(epochs=epochs, **runs)  # type: ignore[arg-type]
        return replace(result, lr=top, unfreeze=unfreeze, full_fit=full_fit)


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


def _call(action: str, *args: object, **kwargs: object) -> str:
    """The command as the Python call that did it, for the history: ``freeze('layer1')``."""
    parts = [repr(a) for a in args]
    parts += [f"{key}={value!r}" for key, value in kwargs.items() if value is not None]
    return f"{action}({', '.join(parts)})"
