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
from .devices.device import DeviceReport, MoveReport, list_devices, resolve_device
from .devices.device import move as move_model
from .devices.estimate import Estimate
from .devices.estimate import estimate as estimate_step
from .devices.memory import MemoryReport, ResetReport, breakdown
from .devices.memory import reset_peaks as reset_peak_counters
from .devices.pinbench import PinReport
from .devices.pinbench import pinbench as time_host_copies
from .devices.placement import CheckReport, find_misplaced
from .diagnostics.compiled import CompileWatch
from .diagnostics.doctor import DoctorReport, diagnose
from .errors import TorchMagicError
from .modules import unwrap
from .surgery import edits, model_checks, scheduler_sync
from .surgery.batchnorm import POLICIES
from .surgery.counting import count, describe_groups, group_keys
from .surgery.grammar import LrSpec, check_positive, parse_targets, spread_lrs
from .surgery.history import History, Record
from .surgery.results import Change, Effect, HistoryEntry, SummaryReport
from .surgery.selection import resolve, select
from .surgery.summary import summarize
from .surgery.transaction import Transaction
from .training.amp import AmpController, AmpStatus, cell_autocast
from .training.fit import FitHistory, FitObserver, FitPlan, resolve_loss
from .training.fit import fit as run_fit
from .training.schedule_steps import SchedStep
from .workspace import Workspace


@dataclass
class SessionConfig:
    """Defaults a user can change (the magics mirror them as traitlets)."""

    bn_policy: str = "eval"
    unfreeze_lr_ratio: float = 0.1
    summary_depth: int = 2
    summary_max_rows: int = 60


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

    # -- resolving -------------------------------------------------------------------

    def _target(self, name: str, model: nn.Module, optimizer: str | None) -> edits.BoundModel:
        opt_name, opt = self.workspace.resolve_optimizer(name, unwrap(model), optimizer)
        scheds = self.workspace.schedulers(opt) if opt is not None else []
        return edits.BoundModel(unwrap(model), name, opt, opt_name, scheds)

    def bound(self, model: str | None = None, optimizer: str | None = None) -> edits.BoundModel:
        """The named (or current) model with the optimizer and schedulers bound to it."""
        name, module = self.workspace.resolve_model(model)
        return self._target(name, module, optimizer)

    def _selection(self, targets: Sequence[str], exclude: Sequence[str], optimizer: str | None):
        parsed = parse_targets(targets) if targets else ()
        excluded = parse_targets(exclude)
        name, model, relative = self.workspace.split_root(parsed)
        target = self._target(name, model, optimizer)
        model_checks.check_editable(target.model, name)
        relative_excluded = []
        for t in excluded:
            relative_excluded.append(t.without_head() if t.head == name else t)
        return target, select(target.model, relative, relative_excluded)

    def _one_module(
        self, where: str | None, optimizer: str | None = None, *, edit: bool = True
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
        target = self._target(name, model, optimizer)
        check = model_checks.check_editable if edit else model_checks.check_readable
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
        notes = distributed.check_surgery(action, target.model, self.workspace.items())
        before = count(target.model)
        groups_before = group_keys(target.optimizer)
        tx = Transaction()
        try:
            effect = step(tx)
        except BaseException:
            tx.revert()
            raise
        effect = replace(effect, notes=effect.notes + notes)
        change = Change(
            action=action,
            command=command,
            model_name=target.model_name,
            effect=effect,
            before=before,
            after=count(target.model),
            optimizer_name=target.optimizer_name,
            groups=describe_groups(target.optimizer, groups_before, target.schedulers),
            dry_run=dry_run,
        )
        if dry_run:
            tx.revert()
            return change
        tx.commit()
        self._history.push(change, target.model, tx)
        self.workspace.current = target.model_name
        if target.optimizer_name is not None:
            self.workspace.optimizer_of[target.model_name] = target.optimizer_name
        return change

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
        num_classes: int,
        *,
        dropout: float | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: str | None = None,
    ) -> Change:
        """Swap the head for a fresh layer with ``num_classes`` outputs.

        ``where`` is ``"auto"``/None (search the current model), a path to the head
        (``"fc"``, ``"model.classifier.6"``), or a model/sub-tree to search.
        """
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
            lambda tx: edits.replace_head(target, root, root_name, num_classes, dropout, tx),
        )

    def summary(self, where: str | None = None, depth: int | None = None) -> SummaryReport:
        """A bounded table of the model (or a sub-tree) with trainable state and groups."""
        if depth is not None and depth < 0:
            raise TorchMagicError(f"depth must be >= 0, got {depth}", param="depth")
        target, relative_name, root = self._one_module(where, edit=False)
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

    def _is_live(self, record: Record) -> bool:
        bound = self.workspace.namespace.get(record.change.model_name)
        return isinstance(bound, nn.Module) and unwrap(bound) is record.model

    def history(self) -> tuple[HistoryEntry, ...]:
        """Every command so far, oldest first; entries on a rebound model are stale."""
        return self._history.entries(self._is_live)

    def undo(self) -> Change:
        """Revert the newest command still applying to a bound model."""
        record = self._history.pop_live(self._is_live)
        model = record.model
        opt = self.workspace.namespace.get(record.change.optimizer_name or "")
        opt = opt if isinstance(opt, torch.optim.Optimizer) else None
        before, groups_before = count(model), group_keys(opt)
        record.tx.revert()
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
        """The session's device type, else that of the (current) model's parameters."""
        if self.device is not None:
            return self.device.type
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
        bound = self.bound(model)
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
        return time_host_copies(self._variable(loader, "loader"), self.device)

    def memory(self, model: str | None = None) -> MemoryReport:
        """Memory in use on the (current) model's device, broken down into parameters,
        gradients, optimizer state and the rest; the device figures alone when no model
        is named and none can be found."""
        try:
            bound = self.bound(model)
        except TorchMagicError:
            if model is not None:
                raise
            return breakdown(None)
        return breakdown(bound.model, bound.optimizer, model_name=bound.model_name)

    def reset_peaks(self, tracebacks: bool = False) -> ResetReport:
        """Start the peak-memory counters again; ``tracebacks`` also forgets the last
        traceback, whose frames can keep tensors alive."""
        return reset_peak_counters(tracebacks)

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

    def fit(
        self,
        train: object,
        *,
        model: str | None = None,
        val: object | None = None,
        epochs: int = 1,
        max_steps: int | None = None,
        loss: str = "cross_entropy",
        cache_features: bool = False,
        optimizer: str | None = None,
        observer: FitObserver | None = None,
        sched_step: SchedStep | None = None,
    ) -> FitHistory:
        """Train the (current) model on ``train`` with its optimizer, its schedulers and
        the AMP policy; returns the history, which the session also keeps in ``fits``.
        ``sched_step`` ("batch" or "epoch") steps every scheduler at that granularity
        instead of each one's own (see ``core.training.schedule_steps``)."""
        name, module = self.workspace.resolve_model(model)
        target = self._target(name, module, optimizer)
        if target.optimizer is None:
            raise TorchMagicError(
                f"no optimizer holds the parameters of '{name}'; create one, e.g. "
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
            epochs=epochs,
            max_steps=max_steps,
            cache_features=cache_features,
            sched_step=sched_step,
            label=f"fit {len(self.fits) + 1}",
        )
        if observer is not None:
            plan.observer = observer
        history = run_fit(plan)
        self.fits.append(history)
        self.workspace.current = name
        return history


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
