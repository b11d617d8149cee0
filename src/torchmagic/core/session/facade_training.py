"""Session's training methods: fit, the lr range test, base lrs, fine_tune; each delegates
to ``training``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..advice import Command
from ..surgery.results import Change
from ..training.fit_events import FitHistory, FitObserver
from ..training.lr_find import LrFindResult
from ..training.progressive import Monitor
from ..training.recipe import FineTuneResult
from ..training.schedule_steps import SchedStep
from . import shared, surgery, training
from .part import SessionPart

if TYPE_CHECKING:
    pass


class TrainingFacade(SessionPart):
    """The training part of :class:`Session`'s front door."""

    # -- training --------------------------------------------------------------------

    @shared.serialised("a fit")
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
        return training.fit(
            self._session,
            train,
            model,
            val,
            epochs,
            max_steps,
            loss,
            cache_features,
            optimizer,
            observer,
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
        )

    @shared.serialised("an lr range test")
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
        return training.lr_find(
            self._session, train, model, start, end, steps, apply, optimizer, observer, loss
        )

    @shared.serialised()
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
        return surgery.set_base_lrs(self._session, lrs, model, optimizer, command)

    @shared.serialised("a fine_tune run")
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
        return training.fine_tune(
            self._session,
            train,
            val,
            epochs,
            freeze_epochs,
            lr,
            model,
            loss,
            optimizer,
            observer,
            sched_step,
            accumulate,
            clip,
            schedule,
            bn,
        )
