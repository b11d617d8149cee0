import io
import time
from collections import OrderedDict

import pytest
import torch
from rich.console import Console
from torch import nn
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader, TensorDataset

from builders import blobs
from torchmagic import Session, TorchMagicError
from torchmagic.core.advice import spelled
from torchmagic.core.training.fit_events import StopReason
from torchmagic.core.training.progressive import Pacer, Pacing
from torchmagic.magics.spelling import magic_line
from torchmagic.render import TerminalProgress, render


def model4():
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            b1=nn.Linear(8, 16),
            a1=nn.ReLU(),
            b2=nn.Linear(16, 16),
            a2=nn.ReLU(),
            b3=nn.Linear(16, 16),
            a3=nn.ReLU(),
            fc=nn.Linear(16, 4),
        )
    )


def train_loader():
    x, y = blobs(200)
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True, generator=g)


def val_loader(shift=0):
    """``shift=1``: labels the training set contradicts, so the val loss only rises."""
    x, y = blobs(60, seed=0)
    return DataLoader(TensorDataset(x, (y + shift) % 4), batch_size=60)


def frozen_session(scheduler=False):
    model = model4()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scheds = [S.StepLR(opt, 1, gamma=0.9)] if scheduler else []
    tm = Session(model, opt, schedulers=scheds)
    tm.freeze("b1", "b2", "b3")
    return tm, model, opt, scheds


class Events:
    refresh_seconds = 0.0

    def __init__(self, model=None):
        self.model = model
        self.log = []
        self.weights = {}
        self.steps = []

    def on_start(self, start):
        self.log.append("start")

    def on_step(self, info):
        self.steps.append(info)

    def on_epoch(self, metrics):
        self.log.append(f"epoch {metrics.epoch}")
        if self.model is not None:
            self.weights[metrics.epoch] = {k: v.clone() for k, v in self.model.state_dict().items()}

    def on_unfreeze(self, event):
        self.log.append(f"unfreeze {event.block}")

    def close(self):
        self.log.append("close")


def test_every_n_epochs_with_the_lr_ratio_chain():
    tm, model, opt, _ = frozen_session()
    events = Events()
    history = tm.fit(
        train_loader(),
        val=val_loader(),
        epochs=5,
        unfreeze=["b3", "b2", "b1"],
        every=2,
        lr_ratio=0.5,
        observer=events,
    )
    assert [(e.epoch, e.block) for e in history.unfreezes] == [(2, "b3"), (4, "b2")]
    assert [e.base_lr for e in history.unfreezes] == pytest.approx([0.025, 0.0125])
    assert events.log.index("unfreeze b3") == events.log.index("epoch 2") + 1
    assert events.log.index("unfreeze b2") == events.log.index("epoch 4") + 1
    assert all(p.requires_grad for p in [*model.b3.parameters(), *model.b2.parameters()])
    assert not any(p.requires_grad for p in model.b1.parameters())  # after the last epoch: no
    by_name = {g.get("name"): g for g in opt.param_groups}
    assert [p for p in by_name["b3"]["params"]] == list(model.b3.parameters())
    assert by_name["b3"]["lr"] == pytest.approx(0.025) and by_name["b2"]["lr"] == pytest.approx(
        0.0125
    )
    name = tm.history()[-1].model_name
    assert [spelled(e.command, magic_line) for e in tm.history()][-2:] == [
        f"%unfreeze {name}.b3 lr=0.025 (fit 1, after epoch 2)",
        f"%unfreeze {name}.b2 lr=0.0125 (fit 1, after epoch 4)",
    ]
    assert (
        spelled(tm.history()[-1].command)
        == f'tm.unfreeze("{name}.b2", lr=0.0125) (fit 1, after epoch 4)'
    )

    tm.undo()
    tm.undo()  # both unfreezes are ordinary history entries
    assert not any(p.requires_grad for p in [*model.b2.parameters(), *model.b3.parameters()])
    assert all(not g["params"] for g in opt.param_groups if g.get("name") in ("b2", "b3"))


def test_schedulers_stay_in_step_across_unfreezes():
    tm, model, opt, (sched,) = frozen_session(scheduler=True)
    tm.fit(train_loader(), epochs=4, unfreeze=["b3", "b2"], every=1)
    assert len(sched.base_lrs) == len(opt.param_groups) == len(sched.get_last_lr())
    assert all("initial_lr" in g for g in opt.param_groups)
    opt.state_dict()
    sched.step()


def test_patience_unfreezes_on_a_stall_then_early_stop_restores_the_best():
    tm, model, opt, _ = frozen_session()
    events = Events(model)
    history = tm.fit(
        train_loader(),
        val=val_loader(shift=1),  # the val loss rises every epoch: epoch 1 stays best
        epochs=12,
        unfreeze=["b3", "b2"],
        patience=2,
        early_stop=True,
        keep_best=True,
        observer=events,
    )
    losses = [m.val_loss for m in history.epochs]
    assert losses == sorted(losses)  # the premise
    assert [(e.epoch, e.block) for e in history.unfreezes] == [(3, "b3"), (5, "b2")]
    assert len(history.epochs) == 7 and history.stop_reason is StopReason.EARLY_STOP
    assert "since the last unfreeze" in history.stopped
    assert history.best_epoch == 1
    now = model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in events.weights[1].items())
    assert not torch.equal(now["fc.weight"], events.weights[7]["fc.weight"])


def test_patience_waits_while_the_metric_improves():
    tm, model, _, _ = frozen_session()
    history = tm.fit(train_loader(), val=val_loader(), epochs=4, unfreeze=["b3"], patience=1)
    losses = [m.val_loss for m in history.epochs]
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == 4  # the premise
    assert history.unfreezes == ()
    assert not any(p.requires_grad for p in model.b3.parameters())


def test_pacer_decisions_on_a_scripted_metric():
    calls = []
    pacing = Pacing(
        ("x", "y"),
        patience=2,
        lr_ratio=0.1,
        early_stop=True,
        unfreeze=lambda block, lr, epoch: calls.append((block, lr, epoch)),
        head_base_lr=lambda: 1.0,
    )
    pacer = Pacer(pacing)
    decisions = []
    for epoch, loss in enumerate([1.0, 0.9, 0.95, 0.96, 0.8, 0.85, 0.86, 0.87, 0.88], 1):
        pacer.observe(epoch, loss)
        if pacer.unfreeze_due(epoch):
            pacer.unfreeze_next(epoch)
            decisions.append((epoch, "unfreeze"))
        elif pacer.stop_reason(epoch):
            decisions.append((epoch, "stop"))
            break
    assert calls == [("x", 0.1, 4), ("y", pytest.approx(0.01), 7)]
    assert decisions == [(4, "unfreeze"), (7, "unfreeze"), (9, "stop")]


def test_monitor_acc_without_an_accuracy_stops_with_a_reason():
    model = nn.Sequential(OrderedDict(body=nn.Linear(8, 8), fc=nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(40, 8)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=20)
    tm = Session(model, opt)
    tm.freeze("body")
    history = tm.fit(
        data, val=data, epochs=3, loss="mse", unfreeze=["body"], patience=1, monitor="acc"
    )
    assert history.stop_reason is StopReason.NO_METRIC and len(history.epochs) == 1


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"unfreeze": ["b3"]}, "unfreeze"),
        ({"unfreeze": ["b3"], "every": 1, "patience": 1}, "unfreeze"),
        ({"unfreeze": ["b3"], "every": 0}, "every"),
        ({"unfreeze": ["b3"], "patience": 2, "val": None}, "val"),
        ({"unfreeze": ["b3"], "every": 1, "keep_best": True, "val": None}, "val"),
        ({"unfreeze": ["b3"], "every": 1, "lr_ratio": 0}, "lr_ratio"),
        ({"unfreeze": ["b3"], "every": 1, "monitor": "bogus"}, "monitor"),
        ({"unfreeze": ["nope"], "every": 1}, None),
        ({"unfreeze": ["fc"], "every": 1}, "unfreeze"),  # already trainable
        ({"unfreeze": ["b3", "b3"], "every": 1}, "unfreeze"),
        ({"every": 1}, "every"),
        ({"patience": 1}, "patience"),
        ({"unfreeze": ["b3"], "every": 1, "cache_features": True}, "cache_features"),
    ],
)
def test_bad_pacing_is_refused_before_any_step(kwargs, param):
    tm, model, opt, _ = frozen_session()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    entries = len(tm.history())
    kwargs = {"val": val_loader(), **kwargs}
    with pytest.raises(TorchMagicError) as error:
        tm.fit(train_loader(), epochs=3, **kwargs)
    if param is not None:
        assert error.value.param == param
    assert len(tm.history()) == entries and tm.fits == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(p.requires_grad for p in model.b3.parameters())


class SlowBatches:
    """A loader that takes a known minimum time per batch."""

    def __init__(self, data, pause):
        self.data, self.pause = data, pause

    def __iter__(self):
        for batch in self.data:
            time.sleep(self.pause)
            yield batch

    def __len__(self):
        return len(self.data)


def test_data_wait_share_in_the_history_and_the_live_progress():
    tm, model, _, _ = frozen_session()
    events = Events()
    data = SlowBatches(train_loader(), 0.02)
    history = tm.fit(data, epochs=2, observer=events)
    assert history.data_wait_s >= 2 * len(data) * 0.02  # at least the sleeps
    assert 0 < history.data_wait_s <= history.wall_s <= history.seconds
    assert events.steps and all(0 < s.data_wait <= 1 for s in events.steps)


def test_data_wait_on_the_cached_feature_path():
    tm, model, _, _ = frozen_session()
    tm.freeze("b1", "b2", "b3")
    history = tm.fit(train_loader(), epochs=2, cache_features=True)
    assert history.cached_features
    assert 0 < history.data_wait_s <= history.wall_s


def test_render_progress_history_and_chart_show_unfreezes_and_data_wait():
    tm, model, _, _ = frozen_session()
    out = io.StringIO()
    progress = TerminalProgress(console=Console(file=out, width=200))
    history = tm.fit(
        train_loader(), val=val_loader(), epochs=3, unfreeze=["b3"], every=1, observer=progress
    )
    progress.finish()
    assert "unfroze b3 after epoch 1 at base lr 0.015" in out.getvalue()
    bundle = render(history)._repr_mimebundle_()
    assert "unfroze b3 after epoch 1" in bundle["text/plain"]
    assert "data wait" in bundle["text/plain"]
    assert "<img" in bundle["text/html"] or "<svg" in bundle["text/html"]
