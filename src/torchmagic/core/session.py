"""The engine's front door: a Session resolves names, runs one edit inside a transaction,
measures it, and keeps the history for undo.

Notebook: the magics hold one Session over the kernel's ``user_ns``. Script::

    tm = torchmagic.Session(model, optimizer, schedulers=[scheduler])
    tm.freeze("layer1-3")
    tm.replace_head("fc", 10)
    tm.unfreeze("layer4", lr=1e-4)
    tm.undo()
"""

from __future__ import annotations

from collections.abc import Callable, Container, MutableMapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from . import distributed
from .errors import TorchMagicError
from .modules import unwrap
from .surgery import edits, heads, scheduler_sync
from .surgery.base_lrs import base_lrs, set_base_lrs
from .surgery.batchnorm import POLICIES
from .surgery.counting import count, describe_groups, group_keys
from .surgery.grammar import (
    LrSpec,
    check_positive,
    parse_lr,
    parse_positive_float,
    parse_targets,
    spread_lrs,
)
from .surgery.history import History, Record
from .surgery.results import Change, Effect, HistoryEntry, SummaryReport
from .surgery.selection import resolve, select
from .surgery.summary import summarize
from .surgery.transaction import Transaction
from .training.amp import AmpController, AmpStatus
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
from .workspace import Workspace


@dataclass
class SessionConfig:
    """Defaults a user can change (the magics mirror them as traitlets)."""

    bn_policy: str = "eval"
    unfreeze_lr_ratio: float = 0.1
    summary_depth: int = 2
    summary_max_rows: int = 60


class Session:
    """Transfer-learning surgery on live objects, with undo.

    Give it a model and optimizer (scripts), or a namespace dict in which it finds them by
    variable name (notebooks). Target strings use the grammar of the magics: ``layer1-3``,
    ``features.0-6``, ``"*.bn*"``, ``model.fc``.
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
        self.device: torch.device | None = None  # set by %device; None: where the model is
        self.amp = AmpController()
        self.fits: list[FitHistory] = []

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
        relative_excluded = []
        for t in excluded:
            relative_excluded.append(t.without_head() if t.head == name else t)
        return target, select(target.model, relative, relative_excluded)

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

    # -- commands --------------------------------------------------------------------

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
            raise TorchMagicError(f"--bn {policy}: choose one of {', '.join(POLICIES)}")
        target, selection = self._selection(targets, exclude, optimizer)
        return self._run(
            "freeze",
            command or _command("freeze", targets, exclude=exclude),
            target,
            dry_run,
            lambda tx: edits.freeze(target, selection, policy, tx),
        )

    def unfreeze(
        self,
        *targets: str,
        lr: LrSpec | str = None,
        wd: float | str | None = None,
        exclude: Sequence[str] = (),
        optimizer: str | None = None,
        dry_run: bool = False,
        command: str | None = None,
    ) -> Change:
        """Train ``targets`` again, each block in its own named param group.

        ``lr`` is a float, ``(first, last)`` or ``"first:last"`` for a geometric spread
        over the blocks in module order; without it, ``unfreeze_lr_ratio`` × the head
        group's lr. ``wd`` overrides weight decay for the new groups.
        """
        lr_spec = parse_lr(lr) if isinstance(lr, str) else _checked_lr(lr)
        if isinstance(wd, str):
            weight_decay = parse_positive_float(wd, "wd", allow_zero=True)
        else:
            weight_decay = None if wd is None else check_positive(wd, "wd", allow_zero=True)
        target, selection = self._selection(targets, exclude, optimizer)
        lrs = spread_lrs(lr_spec, len(selection.blocks))
        return self._run(
            "unfreeze",
            command or _command("unfreeze", targets, exclude=exclude),
            target,
            dry_run,
            lambda tx: edits.unfreeze(
                target, selection, lrs, weight_decay, self.config.unfreeze_lr_ratio, tx
            ),
        )

    def replace_head(
        self,
        where: str | None = "auto",
        num_classes: int = 0,
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
                f"the number of classes must be a positive integer, got {num_classes}"
            )
        if where in (None, "auto"):
            name, model = self.workspace.resolve_model()
            root_name, relative = "", None
        else:
            name, model, relative_targets = self.workspace.split_root(parse_targets([where]))
            relative = relative_targets[0]
            root_name = ""
        target = self._target(name, model, optimizer)
        root = target.model
        if relative is not None and not relative.is_whole:
            hits = resolve(root, relative)
            if len(hits) != 1:
                raise TorchMagicError(f"'{where}' names {len(hits)} modules; name one head")
            root_name, root = hits[0]
        return self._run(
            "replace_head",
            command or f"replace_head {where or 'auto'} {num_classes}",
            target,
            dry_run,
            lambda tx: edits.replace_head(target, root, root_name, num_classes, dropout, tx),
        )

    def summary(self, where: str | None = None, depth: int | None = None) -> SummaryReport:
        """A bounded table of the model (or a sub-tree) with trainable state and groups."""
        if depth is not None and depth < 0:
            raise TorchMagicError(f"--depth must be >= 0, got {depth}")
        if where is None:
            name, model = self.workspace.resolve_model()
            relative = None
        else:
            name, model, relative_targets = self.workspace.split_root(parse_targets([where]))
            relative = relative_targets[0]
        target = self._target(name, model, None)
        root, label = target.model, name
        if relative is not None and not relative.is_whole:
            hits = resolve(root, relative)
            if len(hits) != 1:
                raise TorchMagicError(f"'{where}' names {len(hits)} modules; name one")
            label, root = f"{name}.{hits[0][0]}", hits[0][1]
        return summarize(
            root,
            model_name=label,
            optimizer=target.optimizer,
            optimizer_name=target.optimizer_name,
            schedulers=target.schedulers,
            depth=self.config.summary_depth if depth is None else depth,
            max_rows=self.config.summary_max_rows,
        )

    def _is_live(self, record: Record) -> bool:
        bound = self.workspace.namespace.get(record.change.model_name)
        return isinstance(bound, nn.Module) and unwrap(bound) is record.model

    def history(self) -> tuple[HistoryEntry, ...]:
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

    # -- training --------------------------------------------------------------------

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

    def amp_on(self, mode: str = "auto", model: str | None = None) -> AmpStatus:
        """Autocast for training on the session's device (else the current model's)."""
        return self.amp.turn_on(self.device_type(model), mode)

    def autocast(self):
        """``with tm.autocast():`` around forward and loss in a hand-written loop."""
        return self.amp.autocast()

    def step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> bool:
        """backward, (unscale) step, scaler update, zero_grad — correct under every
        precision policy; returns whether the optimizer stepped."""
        return self.amp.step(loss, optimizer)

    def _loader(self, value: object, what: str) -> object:
        if isinstance(value, str):
            if value not in self.workspace.namespace:
                raise TorchMagicError(f"no variable named '{value}' for {what}")
            value = self.workspace.namespace[value]
        if not hasattr(value, "__iter__"):
            raise TorchMagicError(
                f"{what} must be an iterable of batches, got {type(value).__name__}"
            )
        return value

    def _fit_plan(
        self,
        train: object,
        *,
        model: str | None,
        val: object | None,
        loss: str,
        optimizer: str | None,
        label: str,
    ) -> tuple[edits.BoundModel, FitPlan]:
        """The bound model and a plan to train it: its optimizer and schedulers, the
        session's device, AMP policy and the loss. Refuses before anything changes."""
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
                "run %device move first"
            )
        if self.amp.enabled and self.amp.device_type != device.type:
            raise TorchMagicError(
                f"AMP is on for {self.amp.device_type} but '{name}' is on {device.type}; "
                "run %amp on again"
            )
        plan = FitPlan(
            model=target.model,
            model_name=name,
            optimizer=target.optimizer,
            schedulers=scheduler_sync.roots(target.schedulers),
            loss_fn=resolve_loss(loss, self.workspace.namespace),
            device=device,
            amp=self.amp,
            train=self._loader(train, "the training data"),
            val=None if val is None else self._loader(val, "--val"),
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
        loss: str = "cross_entropy",
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
        if epochs < 1:
            raise TorchMagicError(f"--epochs must be at least 1, got {epochs}")
        if max_steps is not None and max_steps < 1:
            raise TorchMagicError(f"--max-steps must be at least 1, got {max_steps}")
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
        loss: str = "cross_entropy",
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
        loss: str = "cross_entropy",
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

    def use(self, name: str) -> str:
        """Make ``name`` the current model for commands that do not name one."""
        self.workspace.resolve_model(name)
        self.workspace.current = name
        return name


def _checked_lr(lr: LrSpec) -> LrSpec:
    if lr is None:
        return None
    if isinstance(lr, tuple):
        first, last = lr
        return (check_positive(first, "lr"), check_positive(last, "lr"))
    return check_positive(lr, "lr")


def _command(action: str, targets: Sequence[str], exclude: Sequence[str] = ()) -> str:
    parts = [action, *targets]
    if exclude:
        parts += ["--except", *exclude]
    return " ".join(parts)
