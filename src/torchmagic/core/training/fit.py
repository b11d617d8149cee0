"""The training loop behind ``Session.fit``: device moves, AMP, scheduler stepping (see
``schedule_steps``), live progress through an observer, clean stops on Ctrl-C and
non-finite losses, and the cached-feature path for linear probing.

No host sync per step. Each step's loss stays on the device; the loop reads the losses
of all steps since the last **check point** at once (one sync), where a check point comes
every ``CHECK_SECONDS`` of training at most (sooner when the observer redraws more often),
at each epoch end and when the run stops. So a non-finite loss at step k stops the run at
the first check point after it: at most ``CHECK_SECONDS`` of steps later, plus the step in
flight. On that stop:

- restored: BatchNorm running statistics (``running_mean``, ``running_var``,
  ``num_batches_tracked``), copied at each check point whose losses were all finite, go
  back to that copy; gradients are cleared (as on every exit);
- not restored: weights and optimizer state. The steps from k to the stop updated them
  (with a GradScaler, a step whose gradients are not finite is skipped and changes
  nothing); the stop message counts the parameter and optimizer-state tensors that now
  hold NaN/inf.

Gradient accumulation and clipping (``FitPlan.accumulate``, ``FitPlan.clip``; the
step itself is ``amp.Accumulation``): one optimizer step per ``accumulate`` loader
batches, each loss divided by ``accumulate``. A *step* is an optimizer step everywhere:
``max_steps``, the per-batch schedulers, the progress and the history count them. The
epoch's last, partial window steps on the batches it holds (as Lightning does; still
divided by ``accumulate``, so it moves less); a window cut by Ctrl-C is dropped, never
stepped. Losses are read at check points after an optimizer step.

Progressive unfreezing, early stop and keep-best (``FitPlan.pacing``) are decided in
``progressive`` after each epoch's validation; the unfreeze itself is the session's.

The plan and its checks are in ``fit_plan``, what the observer is told and the history
in ``fit_events``; the batches (and what ``data_wait_s`` counts) in ``batch_sources``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch

from ..errors import TorchMagicError
from ..integrations.lookup import state_of
from .amp import Accumulation
from .batch_loss import forward_loss
from .batch_sources import batch_source
from .fit_events import EpochMetrics, FitHistory, FitStart, StepInfo, StopReason, discard_progress
from .fit_plan import FitPlan, check_plan
from .non_finite import BatchNormSnapshot, LossLedger, count_non_finite
from .progressive import BestWeights, Pacer
from .run_guards import clear_grads, ctrl_c_requests_stop, module_mode
from .schedule_steps import plan_schedules

CHECK_SECONDS = 0.5


def _length(data: Iterable) -> int | None:
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:
        return None


@dataclass(frozen=True)
class _EpochRun:
    samples: int
    seconds: float
    complete: bool  # every batch of the epoch trained


class _Trainer:
    def __init__(self, plan: FitPlan) -> None:
        self.plan = plan
        self.source = batch_source(plan)
        self.schedule = plan_schedules(plan.schedulers, plan.sched_step)
        self.batches_per_epoch = _length(plan.train)
        self.window = Accumulation(plan.accumulate, plan.clip)
        self.steps_per_epoch = (
            None
            if self.batches_per_epoch is None
            else math.ceil(self.batches_per_epoch / plan.accumulate)
        )
        self.check_seconds = min(plan.observer.refresh_seconds, CHECK_SECONDS)
        self.ledger = LossLedger()
        self.batchnorm = BatchNormSnapshot(plan.model)
        self.steps = 0
        self.samples = 0
        self.interrupt_requested = False
        self.stop: StopReason | None = None
        self.stop_message: str | None = None
        self.trained_lrs = self._group_lrs()
        self.pacer = Pacer(plan.pacing) if plan.pacing is not None else None
        keep_best = plan.pacing is not None and plan.pacing.keep_best
        self.best = BestWeights(plan.model) if keep_best else None
        self.train_seconds = 0.0

    def _group_lrs(self) -> list[Any]:
        """The lrs of non-empty groups, as stored (a tensor lr is not read here)."""
        return [g["lr"] for g in self.plan.optimizer.param_groups if g["params"]]

    def _group_names(self) -> tuple[str, ...]:
        """The names of the groups :meth:`_group_lrs` reads, in the same order."""
        groups = self.plan.optimizer.param_groups
        return tuple(str(g.get("name", f"group {i}")) for i, g in enumerate(groups) if g["params"])

    def _head_position(self) -> int | None:
        """Where the head's group is among :meth:`_group_lrs`: the non-empty group that
        holds the model's last parameter in the optimizer."""
        groups = [g for g in self.plan.optimizer.param_groups if g["params"]]
        where = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
        return next(
            (where[id(p)] for p in reversed(list(self.plan.model.parameters())) if id(p) in where),
            None,
        )

    def _request_interrupt(self) -> None:
        self.interrupt_requested = True

    def _stopping(self, reason: StopReason, message: str) -> None:
        self.stop, self.stop_message = reason, message

    # -- one batch, one optimizer step per window --------------------------------------

    def _batch(self, forward: Callable[[Any], Any], inputs: Any, targets: torch.Tensor) -> bool:
        """Backpropagate one batch into the window; returns whether it closed the window
        (an optimizer step). A batch that raises leaves no BatchNorm statistics of the
        window it was in (none of its batches stepped)."""
        plan = self.plan
        first = self.steps == 0 and not self.window.pending
        if not self.window.pending:
            self.batchnorm.take_batch()
        try:
            loss = forward_loss(plan, forward, inputs, targets, first)
            self.ledger.add(self.steps + 1, loss.detach(), len(targets))
            self.window.add(loss, plan.optimizer, plan.amp.active_scaler)
        except BaseException:  # the window's forwards may have moved the statistics
            self.batchnorm.restore_batch()
            raise
        if self.window.pending:
            return False
        self._stepped()
        return True

    def _close_window(self) -> None:
        """The epoch's last, partial window: step on what it holds."""
        self.window.close(self.plan.optimizer, self.plan.amp.active_scaler)
        self._stepped()

    def _stepped(self) -> None:
        self.steps += 1
        self.trained_lrs = self._group_lrs()
        self.schedule.after_step()

    def _at_max_steps(self) -> bool:
        """Whether the run has made ``max_steps`` optimizer steps (then it stops)."""
        max_steps = self.plan.max_steps
        if max_steps is None or self.steps < max_steps:
            return False
        self._stopping(StopReason.MAX_STEPS, f"reached max_steps={max_steps}")
        return True

    def _interrupted(self, epoch: int, batch_index: int, complete: bool) -> str:
        """What a Ctrl-C stopped: the last step, the batches of an open window it dropped,
        and the epoch it cut (none right after an epoch's last step)."""
        dropped = self.window.pending
        held = (
            f" (the {dropped} batch{'es' if dropped != 1 else ''} accumulated since were dropped)"
            if dropped
            else ""
        )
        cut = ""
        if batch_index and not complete:
            of = f" of {self.batches_per_epoch}" if self.batches_per_epoch else ""
            cut = f"; epoch {epoch + 1} was cut after {batch_index}{of} batches"
        return f"interrupted; the last completed step is {self.steps}{held}{cut}"

    # -- check points ----------------------------------------------------------------

    def _check(self) -> bool:
        """Read the losses since the last check; on a non-finite one, stop and restore
        what can be restored. Returns whether training may go on."""
        bad = self.ledger.settle()
        if bad is None:
            self.batchnorm.take(self.steps)
            return True
        self._stop_on_non_finite(*bad)
        return False

    def _stop_on_non_finite(self, step: int, value: float) -> None:
        plan = self.plan
        self.batchnorm.restore()
        params = [p for p in plan.model.parameters() if p.requires_grad]
        bad_params, n_params = count_non_finite(params)
        state = [
            t
            for s in state_of(plan.optimizer).values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        ]
        bad_state, _ = count_non_finite(state)
        parts = [
            f"the loss became {value} at step {step}; stopped after step {self.steps} "
            f"(losses are read every {self.check_seconds:g} s and at each epoch end)"
        ]
        if self.batchnorm.live:
            parts.append(f"BatchNorm running statistics restored to step {self.batchnorm.step}")
        if bad_params or bad_state:
            parts.append(
                f"{bad_params} of {n_params} trainable parameter tensors and {bad_state} "
                f"optimizer state tensors hold NaN/inf since step {step}: reload them from "
                "a checkpoint"
            )
        else:
            scaler = " (the GradScaler skipped the non-finite steps)" if plan.amp.scaler else ""
            parts.append(f"weights and optimizer state are finite{scaler}")
        self._stopping(StopReason.NON_FINITE_LOSS, "; ".join(parts))

    # -- epochs ----------------------------------------------------------------------

    def _train_epoch(self, epoch: int) -> _EpochRun:
        plan = self.plan
        self.ledger.start_epoch()
        samples = batch_index = epoch_steps = 0
        complete = False
        start = last_check = last_redraw = perf_counter()
        waited_before = self.source.wait_s
        iterator = self.source.batches(epoch)
        while True:
            if self.interrupt_requested:  # Ctrl-C during the last step or the validation
                # right after an epoch's last batch (its window stepped) the epoch is whole:
                # its schedulers step
                complete = 0 < batch_index == self.batches_per_epoch and not self.window.pending
                self._stopping(
                    StopReason.INTERRUPTED, self._interrupted(epoch, batch_index, complete)
                )
                break
            try:
                forward, inputs, targets = next(iterator)
                stepped = self._batch(forward, inputs, targets)
            except StopIteration:
                complete = True
                if self.window.pending:
                    self._close_window()
                    self._at_max_steps()
                break
            except KeyboardInterrupt:  # raised where no handler could defer it
                self.interrupt_requested = True
                continue
            samples += len(targets)
            self.samples += len(targets)
            batch_index += 1
            if not stepped:  # the window is open: no step to count or check yet
                continue
            epoch_steps += 1
            if self._at_max_steps():
                complete = batch_index == self.batches_per_epoch
                break
            now = perf_counter()
            if now - last_check < self.check_seconds:
                continue
            last_check = now
            if not self._check():
                break
            if now - last_redraw >= plan.observer.refresh_seconds:
                last_redraw = now
                plan.observer.on_step(
                    StepInfo(
                        epoch=epoch + 1,
                        epochs=plan.epochs,
                        step=self.steps,
                        batch=epoch_steps,
                        batches=self.steps_per_epoch,
                        samples_per_s=samples / (now - start),
                        loss=self.ledger.epoch_loss,
                        lrs=tuple(float(lr) for lr in self._group_lrs()),
                        data_wait=(self.source.wait_s - waited_before) / (now - start),
                        groups=self._group_names(),
                        head=self._head_position(),
                    )
                )
        if self.stop is not StopReason.NON_FINITE_LOSS:
            self._check()
        return _EpochRun(samples, perf_counter() - start, complete)

    def _epoch(self, epoch: int) -> EpochMetrics | None:
        """Train one epoch, validate, step the per-epoch schedulers; None when no step ran."""
        run = self._train_epoch(epoch)
        self.train_seconds += run.seconds
        if not run.samples:
            return None
        train_loss = self.ledger.epoch_loss
        trained_lrs = tuple(float(lr) for lr in self.trained_lrs)
        val_loss = val_acc = None
        val_metrics: dict[str, float] = {}
        if self.stop is not StopReason.NON_FINITE_LOSS:
            announce = getattr(self.plan.observer, "on_validation_start", None)
            if self.plan.val is not None and announce is not None:  # optional for observers
                batches = len(self.plan.val) if isinstance(self.plan.val, Sized) else None
                announce(epoch + 1, batches)
            val_loss, val_acc, val_metrics = self.source.validate()
            if run.complete:
                self.schedule.after_epoch(val_loss if val_loss is not None else train_loss)
        return EpochMetrics(
            epoch + 1,
            train_loss,
            val_loss,
            val_acc,
            run.samples,
            run.seconds,
            trained_lrs,
            self._group_names(),
            self._head_position(),
            val_metrics,
        )

    def _pace(self, metrics: EpochMetrics) -> None:
        """After a complete epoch: note a new best (and copy its weights with keep_best),
        then unfreeze the next block, or stop early."""
        pacer, plan = self.pacer, self.plan
        if pacer is None:
            return
        value = pacer.metric(metrics)
        if value is None and pacer.pacing.needs_validation:
            monitor = pacer.pacing.monitor
            what = {"loss": "a loss", "acc": "an accuracy"}.get(monitor, f"a value of {monitor}")
            self._stopping(
                StopReason.NO_METRIC,
                f"monitor={monitor!r} but the validation data gives no {what} "
                f"(classification metrics need class scores of shape (N, C) and integer "
                f"targets); stopped after epoch {metrics.epoch}",
            )
            return
        if pacer.observe(metrics.epoch, value) and self.best is not None:
            self.best.take(metrics.epoch)
        if metrics.epoch >= plan.epochs:
            return
        if pacer.unfreeze_due(metrics.epoch):
            event = pacer.unfreeze_next(metrics.epoch)
            # the unfreeze may have swapped BatchNorm modules (the ``frozen`` policy)
            self.batchnorm = BatchNormSnapshot(plan.model)
            plan.observer.on_unfreeze(event)
        elif (reason := pacer.stop_reason(metrics.epoch)) is not None:
            self._stopping(StopReason.EARLY_STOP, reason)

    def _keep_best(self, epochs: Sequence[EpochMetrics]) -> int | None:
        """keep_best: load the best epoch's weights back when the run ended on another."""
        if self.best is None or self.best.epoch is None:
            return None
        if epochs and epochs[-1].epoch != self.best.epoch:
            self.best.restore()
        return self.best.epoch

    def run(self) -> FitHistory:
        plan = self.plan
        precision = plan.amp.status().dtype or "fp32"
        epochs: list[EpochMetrics] = []
        best_epoch = None
        start = perf_counter()
        plan.observer.on_start(
            FitStart(
                plan.label,
                plan.model_name,
                plan.epochs,
                plan.max_steps,
                precision,
                self.source.cached,
                self.schedule.choices,
                plan.accumulate,
                plan.clip,
            )
        )
        try:
            with (
                module_mode(plan.model, training=True),
                ctrl_c_requests_stop(self._request_interrupt),
            ):
                for epoch in range(plan.epochs):
                    metrics = self._epoch(epoch)
                    if metrics is None:
                        break
                    epochs.append(metrics)
                    plan.observer.on_epoch(metrics)
                    if self.stop is not None:
                        break
                    self._pace(metrics)
                    if self.stop is not None:
                        break
                best_epoch = self._keep_best(epochs)
        except TorchMagicError:
            if not self.steps:
                discard_progress(plan.observer)
            raise
        finally:
            clear_grads(plan.model, plan.optimizer)
            stopped = getattr(plan.observer, "on_stop", None)  # optional for observers
            if self.stop_message is not None and stopped is not None:
                stopped(self.stop_message)
            plan.observer.close()
        return FitHistory(
            label=plan.label,
            model_name=plan.model_name,
            epochs=tuple(epochs),
            steps=self.steps,
            samples=self.samples,
            seconds=perf_counter() - start,
            stopped=self.stop_message,
            cached_features=self.source.cached,
            precision=precision,
            stop_reason=self.stop,
            schedules=self.schedule.choices,
            unfreezes=tuple(self.pacer.unfrozen) if self.pacer is not None else (),
            best_epoch=best_epoch,
            data_wait_s=self.source.wait_s,
            wall_s=self.train_seconds,
            accumulate=plan.accumulate,
            clip=plan.clip,
            metrics=tuple(name for name, _ in plan.metrics),
            monitor=plan.pacing.monitor if plan.pacing is not None else None,
        )


def fit(plan: FitPlan) -> FitHistory:
    """Train ``plan.model`` and return its history (also when stopped early). A plan
    that cannot train is refused before anything changes."""
    check_plan(plan)
    return _Trainer(plan).run()
