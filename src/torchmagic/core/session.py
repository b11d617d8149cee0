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

from .errors import TorchMagicError
from .modules import unwrap
from .surgery import edits, scheduler_sync
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
from .training.fit import FitHistory, FitObserver, FitPlan, resolve_loss
from .training.fit import fit as run_fit
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
        before = count(target.model)
        groups_before = group_keys(target.optimizer)
        tx = Transaction()
        try:
            effect = step(tx)
        except BaseException:
            tx.revert()
            raise
        change = Change(
            action=action,
            command=command,
            model_name=target.model_name,
            effect=effect,
            before=before,
            after=count(target.model),
            optimizer_name=target.optimizer_name,
            groups=describe_groups(target.optimizer, groups_before),
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
        labels: Sequence[str] | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: str | None = None,
    ) -> Change:
        """Swap the head for a fresh layer with ``num_classes`` outputs.

        ``where`` is ``"auto"``/None (search the current model), a path to the head
        (``"fc"``, ``"model.classifier.6"``), or a model/sub-tree to search. ``labels``
        names the classes in a Hugging Face config (``num_classes`` defaults to their count).
        """
        if labels is not None and num_classes == 0:
            num_classes = len(labels)
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
            lambda tx: edits.replace_head(
                target, root, root_name, num_classes, dropout, tx, labels
            ),
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
            groups=describe_groups(opt, groups_before),
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
    ) -> FitHistory:
        """Train the (current) model on ``train`` with its optimizer, its schedulers and
        the AMP policy; returns the history, which the session also keeps in ``fits``."""
        if epochs < 1:
            raise TorchMagicError(f"--epochs must be at least 1, got {epochs}")
        if max_steps is not None and max_steps < 1:
            raise TorchMagicError(f"--max-steps must be at least 1, got {max_steps}")
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
            epochs=epochs,
            max_steps=max_steps,
            cache_features=cache_features,
            label=f"fit {len(self.fits) + 1}",
        )
        if observer is not None:
            plan.observer = observer
        history = run_fit(plan)
        self.fits.append(history)
        self.workspace.current = name
        return history

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
