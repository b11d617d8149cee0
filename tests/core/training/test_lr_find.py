import copy
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader, TensorDataset

from builders import blobs
from torchmagic import Session, TorchMagicError
from torchmagic.core.training.lr_find import _steepest
from torchmagic.render import render


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            body=nn.Linear(8, 16),
            norm=nn.BatchNorm1d(16),
            act=nn.ReLU(),
            fc=nn.Linear(16, 4),
        )
    )


def loader(seed=0):
    x, y = blobs(200)
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(x, y), batch_size=20, shuffle=True, generator=g)


def setup(scheduler=True):
    """An AdamW with warm state and two groups (body at 0.1x), a stepped scheduler."""
    model = bn_model()
    opt = torch.optim.AdamW(
        [
            {"params": [*model.body.parameters(), *model.norm.parameters()], "lr": 1e-3},
            {"params": model.fc.parameters(), "lr": 1e-2},
        ],
        weight_decay=0.05,
    )
    scheds = [S.StepLR(opt, 1, gamma=0.5)] if scheduler else []
    tm = Session(model, opt, schedulers=scheds)
    tm.fit(loader(1), epochs=1)
    return tm, model, opt, scheds


def snapshot(model, opt, scheds, scaler, data):
    return {
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [(p.grad, None if p.grad is None else p.grad.clone()) for p in model.parameters()],
        "opt": copy.deepcopy(opt.state_dict()),
        "state_ids": {id(p): {k: id(v) for k, v in s.items()} for p, s in opt.state.items()},
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "scheds": [copy.deepcopy(s.state_dict()) for s in scheds],
        "scaler": scaler.state_dict(),
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state()[1].copy(),
        "random": random.getstate(),
        "loader": data.generator.get_state(),
        "training": [m.training for m in model.modules()],
    }


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def test_everything_is_restored_bit_for_bit_adamw_scheduler_batchnorm_scaler():
    tm, model, opt, scheds = setup()
    tm.amp.turn_on("cpu", "bf16")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1)
    tm.amp.scaler = scaler  # a scale that moves every step
    model.fc.weight.grad = torch.full_like(model.fc.weight, 0.25)  # a leftover gradient
    model.train()
    model.norm.eval()  # a flag the run must give back
    data = loader(7)
    before = snapshot(model, opt, scheds, scaler, data)
    grad_object = model.fc.weight.grad
    result = tm.lr_find(data, steps=40, end=100.0)
    assert len(result.lrs) >= 5 and result.stopped  # it trained and diverged
    after = snapshot(model, opt, scheds, scaler, data)
    for key in before:
        if key == "state_ids":
            assert before[key] == after[key]  # the same state tensor objects
        else:
            assert same(before[key], after[key]), key
    assert model.fc.weight.grad is grad_object
    assert all(p.grad is None for p in model.body.parameters())


def test_the_next_epoch_is_the_one_it_would_have_been():
    histories = []
    for run_lr_find in (False, True):
        tm, model, opt, _ = setup()
        data = loader(3)
        if run_lr_find:
            tm.lr_find(data, steps=30)
        tm.fit(data, epochs=1)
        histories.append({k: v.clone() for k, v in model.state_dict().items()})
    assert same(histories[0], histories[1])


class Recorder:
    refresh_seconds = 0.0

    def __init__(self):
        self.lrs = []

    def on_start(self, start):
        self.start = start

    def on_step(self, info):
        self.lrs.append(info.lrs)

    def on_epoch(self, metrics):
        raise AssertionError("lr_find has no epochs")

    def on_unfreeze(self, event):
        raise AssertionError("lr_find unfreezes nothing")

    def close(self):
        self.closed = True


def test_groups_scale_together_and_the_curve_is_exponential():
    tm, model, opt, _ = setup(scheduler=False)
    observer = Recorder()
    result = tm.lr_find(loader(), start=1e-5, end=1e-1, steps=20, observer=observer)
    assert observer.closed and observer.start.max_steps == 20
    assert result.reference_group == 1 and result.ratios == (0.1, 1.0)
    for body, head in observer.lrs:
        assert body == pytest.approx(0.1 * head)
    assert result.lrs[0] == pytest.approx(1e-5)
    ratios = [b / a for a, b in zip(result.lrs, result.lrs[1:], strict=False)]
    assert ratios == pytest.approx([10 ** (4 / 19)] * len(ratios))
    assert len(result.losses) == len(result.smoothed) == len(result.lrs)


def test_stops_when_the_smoothed_loss_diverges():
    tm, *_ = setup(scheduler=False)
    result = tm.lr_find(loader(), start=1e-3, end=1e4, steps=50)
    assert len(result.lrs) < 50
    assert "4×" in result.stopped or "loss became" in result.stopped
    assert result.suggestion is not None
    low, high = result.falling
    assert low <= result.suggestion <= high <= result.lrs[-1]
    assert result.suggestion <= result.min_lr


def test_a_run_that_reaches_its_last_step_did_not_stop_early():
    """Divergence seen on the last step is no early stop: every step ran."""
    calls = []

    def jumps_at_the_last_step(output, target):
        calls.append(1)
        loss = nn.functional.cross_entropy(output, target)
        return loss * (1000.0 if len(calls) == 12 else 0.0) + 1.0

    tm, *_ = setup(scheduler=False)
    result = tm.lr_find(loader(), steps=12, loss=jumps_at_the_last_step)  # a callable
    assert len(result.lrs) == 12 and result.smoothed[-1] > 4 * min(result.smoothed)
    assert result.stopped is None
    calls.clear()
    result = tm.lr_find(loader(), steps=13, loss=jumps_at_the_last_step)
    assert len(result.lrs) == 12 and "4×" in result.stopped  # one step short: early


def test_progress_counts_lr_find_in_steps_not_epochs():
    """lr_find cycles the loader: its progress names no epochs."""
    from torchmagic.render import Rendered
    from torchmagic.render.progress import FitProgress

    tm, *_ = setup(scheduler=False)
    progress = FitProgress(clock=lambda: 0.0)
    progress.refresh_seconds = 0.0
    tm.lr_find(loader(), steps=25, observer=progress)  # 10 batches per pass: 2.5 passes
    first, numbers, last = str(Rendered(progress.view(), 100)).splitlines()  # one height
    assert first.startswith("lr_find · model · fp32 · 25 steps · schedulers: none")
    assert "epoch" not in first + last and numbers.startswith("loss ")
    assert last == "25 steps in 00:00"


def explode(output, target):
    """A loss that becomes inf once the logits grow."""
    loss = nn.functional.cross_entropy(output, target)
    return loss if output.abs().max() < 50 else loss * float("inf")


def test_stops_on_a_non_finite_loss_and_keeps_only_finite_points():
    model = bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(namespace={"model": model, "optimizer": opt, "explode": explode})
    result = tm.lr_find(loader(), start=1e-3, end=1e6, steps=100, loss="explode")
    assert "loss became inf" in result.stopped
    assert all(np.isfinite(result.losses))


def test_steepest_descent_on_a_known_curve():
    lrs = [10 ** (-6 + i / 10) for i in range(60)]
    # flat, then falling fastest at index 35, minimum at 45, rising after
    smoothed = [2.0 - 1.5 / (1 + np.exp(-(i - 35) / 3)) for i in range(46)]
    smoothed += [smoothed[-1] + 0.1 * k for k in range(1, 15)]
    best, first, last = _steepest(lrs, smoothed)
    assert best == 35 and first == 0 and last == 45


def test_a_low_first_average_does_not_hide_the_fall_after_it():
    # as in the quickstart: the first smoothed values (few losses) are the lowest of the
    # run, then the loss falls from 0.31 to 0.22 and rises
    lrs = [10 ** (-7 + i / 12) for i in range(100)]
    smoothed = [0.18, 0.2, 0.25] + [0.31 - 0.09 * i / 60 for i in range(61)]
    smoothed += [smoothed[-1] + 0.02 * k for k in range(1, 37)]
    found = _steepest(lrs, smoothed)
    assert found is not None
    best, first, last = found
    assert 3 <= first <= best <= last == 63


def test_no_suggestion_when_the_loss_never_falls():
    lrs = [10 ** (-5 + i / 10) for i in range(40)]
    assert _steepest(lrs, [1.0 + i for i in range(40)]) is None


def test_apply_sets_base_lrs_in_proportion_as_one_undoable_entry():
    tm, model, opt, (sched,) = setup()
    lrs_before = [g["lr"] for g in opt.param_groups]
    bases_before = list(sched.base_lrs)
    entries = len(tm.history())
    result = tm.lr_find(loader(), steps=40, end=100.0, apply=True)
    s = result.suggestion
    assert result.applied is not None and len(tm.history()) == entries + 1
    assert sched.base_lrs == pytest.approx([0.1 * s, s])
    assert opt.param_groups[1]["initial_lr"] == pytest.approx(s)
    factor = lrs_before[1] / bases_before[1]  # the schedule's present factor is kept
    assert opt.param_groups[1]["lr"] == pytest.approx(s * factor)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * s * factor)
    sched.step()  # still in step
    assert opt.param_groups[1]["lr"] == pytest.approx(s * factor / 2)
    tm.undo()
    assert sched.base_lrs == bases_before
    assert [g["initial_lr"] for g in opt.param_groups] == bases_before


def test_apply_without_a_scheduler_sets_the_lrs():
    tm, model, opt, _ = setup(scheduler=False)
    result = tm.lr_find(loader(), steps=40, end=100.0, apply=True)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx(
        [0.1 * result.suggestion, result.suggestion]
    )
    tm.undo()
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-2]


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"start": 1.0, "end": 0.1}, "start"),
        ({"start": 0.0}, "start"),
        ({"steps": 1}, "steps"),
        ({"end": float("inf")}, "end"),
    ],
)
def test_bad_ranges_change_nothing(kwargs, param):
    tm, model, opt, _ = setup(scheduler=False)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(TorchMagicError) as error:
        tm.lr_find(loader(), **kwargs)
    assert error.value.param == param
    assert same(before, opt.state_dict())


def test_render_text_and_chart():
    tm, *_ = setup(scheduler=False)
    result = tm.lr_find(loader(), steps=40, end=100.0)
    bundle = render(result)._repr_mimebundle_()
    assert "suggestion" in bundle["text/plain"] and "steepest descent" in bundle["text/plain"]
    assert "<svg" in bundle["text/html"] and "currentColor" in bundle["text/html"]
