"""Each scheduler is stepped at the granularity its schedule counts."""

import pytest
import torch
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader, TensorDataset

from test_fit import mlp
from torchmagic import Session
from torchmagic.core.training.amp import AmpController
from torchmagic.core.training.fit import fit
from torchmagic.core.training.fit_events import FitStart
from torchmagic.core.training.fit_plan import FitPlan
from torchmagic.core.training.schedule_steps import ScheduleChoice

BATCHES = 6


def six_batches() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6 * BATCHES, 8, generator=g), torch.randint(0, 4, (6 * BATCHES,))
    return DataLoader(TensorDataset(x, y), batch_size=6)


class Recorder:
    """Observer that keeps the start event; and the lr of every optimizer step."""

    refresh_seconds = float("inf")

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.start: FitStart | None = None
        self.step_lrs: list[float] = []
        optimizer.register_step_pre_hook(
            lambda o, a, k: self.step_lrs.append(o.param_groups[0]["lr"])
        )

    def on_start(self, start):
        self.start = start

    def on_step(self, info):
        pass

    def on_epoch(self, metrics):
        pass

    def close(self):
        pass


def run(scheduler_for, epochs=3, lr=0.1, **fit_args):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = scheduler_for(opt)
    recorder = Recorder(opt)
    history = Session(model, opt, schedulers=[scheduler]).fit(
        six_batches(), epochs=epochs, observer=recorder, **fit_args
    )
    return opt, scheduler, recorder, history


def test_transformers_linear_warmup_is_stepped_per_batch():
    transformers = pytest.importorskip("transformers")
    opt, sched, rec, history = run(lambda o: transformers.get_linear_schedule_with_warmup(o, 6, 18))
    assert history.steps == 18 and sched.last_epoch == 18
    assert rec.step_lrs[0] == 0.0 and rec.step_lrs[1] > 0.0  # leaves 0 after step 1
    assert rec.step_lrs[6] == pytest.approx(0.1)  # the top of the warmup
    assert opt.param_groups[0]["lr"] == 0.0  # warmup + decay over: the run ends at 0
    (choice,) = rec.start.schedules
    assert choice.name == "LambdaLR" and choice.every == "batch"
    assert "transformers" in choice.reason
    assert [m.lrs[0] for m in history.epochs] == pytest.approx(rec.step_lrs[5::6])


def test_sched_step_overrides_the_choice():
    transformers = pytest.importorskip("transformers")
    _, sched, rec, _ = run(
        lambda o: transformers.get_linear_schedule_with_warmup(o, 6, 18), sched_step="epoch"
    )
    assert sched.last_epoch == 3
    assert rec.start.schedules == (ScheduleChoice("LambdaLR", "epoch", "sched_step='epoch'"),)
    _, sched, rec, _ = run(lambda o: S.StepLR(o, 6), sched_step="batch")
    assert sched.last_epoch == 18 and rec.start.schedules[0].every == "batch"


def test_one_cycle_per_batch_and_step_lr_per_epoch_in_one_run():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    one_cycle = S.OneCycleLR(opt, max_lr=0.1, total_steps=18)
    step_lr = S.StepLR(opt, 1)
    rec = Recorder(opt)
    Session(model, opt, schedulers=[one_cycle, step_lr]).fit(six_batches(), epochs=2, observer=rec)
    assert one_cycle.last_epoch == 12 and step_lr.last_epoch == 2
    assert [(c.name, c.every) for c in rec.start.schedules] == [
        ("OneCycleLR", "batch"),
        ("StepLR", "epoch"),
    ]


def test_epoch_table_shows_the_lr_the_epoch_trained_at():
    _, _, rec, history = run(lambda o: S.StepLR(o, 1, gamma=0.1))
    assert [m.lrs[0] for m in history.epochs] == pytest.approx([0.1, 0.01, 0.001])
    assert rec.step_lrs[::BATCHES] == pytest.approx([0.1, 0.01, 0.001])


@pytest.mark.parametrize("max_steps, stepped", [(9, 1), (12, 2), (6, 1)])
def test_max_steps_mid_epoch_does_not_step_per_epoch_schedulers(max_steps, stepped):
    _, sched, _, history = run(lambda o: S.StepLR(o, 1), max_steps=max_steps)
    assert history.steps == max_steps
    assert sched.last_epoch == stepped  # 9 steps = one whole epoch and half of the next


def timm_plan(t_in_epochs: bool):
    """A timm CosineLRScheduler on a FitPlan (the session finds timm schedulers through
    scheduler_sync; the loop's stepping is tested here on its own)."""
    timm_scheduler = pytest.importorskip("timm.scheduler")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t_initial = 3 if t_in_epochs else 3 * BATCHES
    sched = timm_scheduler.CosineLRScheduler(
        opt,
        t_initial=t_initial,
        warmup_t=1 if t_in_epochs else 4,
        warmup_lr_init=0.01,
        lr_min=0.001,
        t_in_epochs=t_in_epochs,
    )
    rec = Recorder(opt)
    plan = FitPlan(
        model=model,
        model_name="model",
        optimizer=opt,
        schedulers=[sched],
        loss_fn=torch.nn.functional.cross_entropy,
        device=torch.device("cpu"),
        amp=AmpController(),
        train=six_batches(),
        epochs=3,
        observer=rec,
    )
    return plan, sched, rec


def expected_timm_lrs(t_in_epochs: bool, epochs: int) -> list[float]:
    """The lrs timm's own training loop trains at: ``step_update(n)`` after update n,
    ``step(e + 1)`` after epoch e."""
    plan, sched, _ = timm_plan(t_in_epochs)
    group, lrs, updates = plan.optimizer.param_groups[0], [], 0
    for epoch in range(epochs):
        for _ in range(BATCHES):
            lrs.append(group["lr"])
            updates += 1
            sched.step_update(num_updates=updates)
        sched.step(epoch + 1)
    return lrs


@pytest.mark.parametrize("t_in_epochs", [True, False])
def test_timm_cosine_follows_timms_own_loop(t_in_epochs):
    plan, sched, rec = timm_plan(t_in_epochs)
    fit(plan)
    expected = expected_timm_lrs(t_in_epochs, 3)
    assert rec.step_lrs == pytest.approx(expected)
    assert len(set(rec.step_lrs)) == (3 if t_in_epochs else 3 * BATCHES)  # it moved
    (choice,) = rec.start.schedules
    assert choice == ScheduleChoice(
        "CosineLRScheduler",
        "epoch" if t_in_epochs else "batch",
        f"t_in_epochs={t_in_epochs}",
    )


def test_a_second_fit_continues_a_timm_schedule():
    plan, sched, rec = timm_plan(t_in_epochs=False)
    plan.epochs = 1
    for _ in range(3):
        fit(plan)
    assert rec.step_lrs == pytest.approx(expected_timm_lrs(False, 3))


@pytest.mark.parametrize("t_in_epochs", [True, False])
def test_a_timm_schedule_stepped_by_the_users_loop_continues_where_it_is(t_in_epochs):
    """One epoch trained by hand as timm's own loop does it, then a fit of two: the fit
    continues the schedule (it does not restart the warmup at t=1)."""
    plan, sched, rec = timm_plan(t_in_epochs)
    if t_in_epochs:
        sched.step(1)
    else:
        for n in range(1, BATCHES + 1):
            sched.step_update(num_updates=n)
    plan.epochs = 2
    fit(plan)
    assert rec.step_lrs == pytest.approx(expected_timm_lrs(t_in_epochs, 3)[BATCHES:])
    (choice,) = rec.start.schedules
    t = 1 if t_in_epochs else BATCHES
    assert choice.reason == f"t_in_epochs={t_in_epochs}; continues at t={t} (read from its lr)"


def test_the_first_line_of_the_run_says_when_each_scheduler_steps():
    import io

    from rich.console import Console

    from torchmagic import render

    out = io.StringIO()
    progress = render.TerminalProgress(console=Console(file=out, width=200))
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    one_cycle = S.OneCycleLR(opt, max_lr=0.1, total_steps=6)
    Session(model, opt, schedulers=[one_cycle]).fit(six_batches(), observer=progress)
    progress.finish()
    first = out.getvalue().splitlines()[0]
    assert "fit 1 · model · fp32 · 1 epoch" in first
    assert "OneCycleLR per batch (counts optimizer steps)" in first
