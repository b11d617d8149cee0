"""``fine_tune(schedule="one-cycle", bn=…)`` / ``%fine_tune --schedule one-cycle --bn``:
a fresh OneCycleLR per phase with fastai's conventions, BatchNorm of the frozen body per
policy in the head phase, and the optimizer left at its base lrs after each phase."""


import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import DataLoader, TensorDataset

import torchmagic
from builders import batchnorm_mlp, blobs
from torchmagic import Session, TorchMagicError
from torchmagic.core.advice import spelled
from torchmagic.magics.spelling import magic_line
from torchmagic.render import render

SCHEDULE_KEYS = ("initial_lr", "max_lr", "min_lr")


def build():
    model, opt = batchnorm_mlp()
    train = DataLoader(
        TensorDataset(*blobs(100, seed=0)),
        batch_size=20,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    val = DataLoader(TensorDataset(*blobs(40, seed=1)), batch_size=40)
    return model, opt, train, val


def by_hand(tm, opt, train, val, epochs, pct_start, div, accumulate=1):
    """One phase the way a user would type it: a OneCycleLR bound for one fit, then the
    lrs put back and the scheduler's group keys removed."""
    bases = [g["lr"] for g in opt.param_groups]
    sched = OneCycleLR(
        opt,
        max_lr=bases,
        total_steps=epochs * -(-len(train) // accumulate),
        pct_start=pct_start,
        div_factor=div,
        final_div_factor=1e5 / div,
        cycle_momentum=False,
    )
    tm.workspace.namespace["schedulers"].append(sched)
    tm.fit(train, val=val, epochs=epochs, accumulate=accumulate)
    tm.workspace.namespace["schedulers"].remove(sched)
    for group, base in zip(opt.param_groups, bases, strict=True):
        group["lr"] = base
        for key in SCHEDULE_KEYS:
            del group[key]
    return sched


@pytest.mark.parametrize("accumulate", [1, 2])
def test_one_cycle_per_phase_equals_the_commands_typed_by_hand(accumulate):
    model_a, opt_a, train_a, val_a = build()
    tm_a = Session(model_a, opt_a)
    result = tm_a.fine_tune(
        train_a,
        val=val_a,
        epochs=2,
        freeze_epochs=1,
        lr=3e-3,
        schedule="one-cycle",
        bn="train",
        accumulate=accumulate,
    )

    model_b, opt_b, train_b, val_b = build()
    tm_b = Session(model_b, opt_b)
    tm_b.freeze("model", exclude=["fc"], bn="train")
    head = by_hand(tm_b, opt_b, train_b, val_b, 1, 0.99, 25.0, accumulate)
    tm_b.unfreeze("model", "body", "norm", "mid", "fc", lr=(3e-5, 3e-3))
    full = by_hand(tm_b, opt_b, train_b, val_b, 2, 0.3, 5.0, accumulate)

    assert [e.command for e in tm_a.history()] == [e.command for e in tm_b.history()]
    a, b = model_a.state_dict(), model_b.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(opt_a.state[p]["exp_avg"], opt_b.state[q]["exp_avg"])
    assert [g["lr"] for g in opt_a.param_groups] == [g["lr"] for g in opt_b.param_groups]
    # the schedules ran to their ends: every optimizer step stepped them once
    steps = -(-len(train_a) // accumulate)
    assert (result.head_fit.steps, result.full_fit.steps) == (steps, 2 * steps)
    assert (head.last_epoch, full.last_epoch) == (steps, 2 * steps)
    assert [c.name for c in result.head_fit.schedules] == ["OneCycleLR"]
    assert result.schedule == "one-cycle" and result.bn == "train"


def test_each_phase_runs_the_fastai_shape_and_leaves_the_base_lrs():
    model, opt, train, val = build()
    opt.param_groups[0]["weight_decay"] = 0.02
    tm = Session(model, opt)
    result = tm.fine_tune(train, val=val, epochs=1, lr=4e-3, schedule="one-cycle")
    # the last step of each phase trained at base / 1e5 (fastai's div_final)
    (head_lr,) = result.head_fit.epochs[-1].lrs
    assert head_lr == pytest.approx(1e-2 / 1e5)
    full_lrs = result.full_fit.epochs[-1].lrs
    assert full_lrs[-1] == pytest.approx(4e-3 / 1e5) and full_lrs[0] == pytest.approx(4e-5 / 1e5)
    # afterwards: each group at its base lr, no schedule keys, state_dict round-trips
    named = {g.get("name"): g for g in opt.param_groups if g["params"]}
    assert named["body"]["lr"] == pytest.approx(4e-5) and named["fc"]["lr"] == pytest.approx(4e-3)
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.param_groups[0]["weight_decay"] == 0.02
    assert not any(key in g for g in opt.param_groups for key in SCHEDULE_KEYS)
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)  # momentum is not cycled
    state = opt.state_dict()
    opt.load_state_dict(state)
    assert tm._phase_schedulers == ()
    assert (
        "each run under its own one-cycle schedule"
        in render(result)._repr_mimebundle_()["text/plain"]
    )


def test_the_head_phase_bn_policy_decides_whether_the_frozen_body_bn_trains():
    def running_mean_after_head_phase(bn):
        model, opt, train, val = build()
        seen = []

        class Watch:
            refresh_seconds = float("inf")

            def on_start(self, start):
                pass

            def on_step(self, info):
                pass

            def on_validation_start(self, epoch, batches):
                pass

            def on_epoch(self, metrics):
                seen.append(model.norm.running_mean.clone())

            def on_unfreeze(self, event):
                pass

            def close(self):
                pass

        before = model.norm.running_mean.clone()
        Session(model, opt).fine_tune(
            train, val=val, epochs=1, schedule="one-cycle", bn=bn, observer=Watch()
        )
        return before, seen[0]

    before, after = running_mean_after_head_phase("train")
    assert not torch.equal(before, after)  # fastai's train_bn
    before, after = running_mean_after_head_phase("eval")
    assert torch.equal(before, after)


def test_undo_walks_back_as_for_the_four_commands():
    model, opt, train, val = build()
    params = list(model.parameters())
    tm = Session(model, opt)
    tm.fine_tune(train, val=val, epochs=1, schedule="one-cycle")
    tm.undo()  # the unfreeze: the body is frozen again, its groups gone
    assert [p.requires_grad for p in params] == [False] * 6 + [True, True]
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(model.fc.weight), id(model.fc.bias)}
    tm.undo()  # the freeze
    assert all(p.requires_grad for p in params)
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in params]
    assert opt.param_groups[0]["lr"] == 1e-2
    opt.state_dict()


def test_a_bound_scheduler_is_refused_and_nothing_changes():
    model, opt, train, val = build()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    tm = Session(model, opt, schedulers=[sched])
    with pytest.raises(TorchMagicError, match="already scheduled by StepLR") as refused:
        tm.fine_tune(train, val=val, epochs=1, schedule="one-cycle")
    assert refused.value.param == "schedule"
    assert all(p.requires_grad for p in model.parameters())
    assert not tm.history() and not tm.fits and not opt.state


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"schedule": "cosine"}, "schedule"),
        ({"bn": "freeze"}, "bn"),
        ({"accumulate": 0}, "accumulate"),
        ({"clip": -1.0}, "clip"),
    ],
)
def test_bad_input_changes_nothing(kwargs, param):
    model, opt, train, val = build()
    tm = Session(model, opt)
    with pytest.raises(TorchMagicError) as refused:
        tm.fine_tune(train, val=val, epochs=1, **kwargs)
    assert refused.value.param == param
    assert all(p.requires_grad for p in model.parameters())
    assert not tm.history() and not tm.fits


def test_an_interrupted_head_phase_leaves_the_base_lrs():
    model, opt, train, val = build()

    class Interrupting:
        def __len__(self):
            return len(train)

        def __iter__(self):
            yield next(iter(train))
            raise KeyboardInterrupt

    tm = Session(model, opt)
    result = tm.fine_tune(Interrupting(), val=val, epochs=1, schedule="one-cycle")
    assert result.full_fit is None and result.head_fit.steps == 1
    assert opt.param_groups[0]["lr"] == 1e-2
    assert not any(key in g for g in opt.param_groups for key in SCHEDULE_KEYS)


SETUP = """
import torch
from collections import OrderedDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x, y = torch.randn(60, 8), torch.randint(0, 3, (60,))
train = DataLoader(TensorDataset(x, y), batch_size=20, shuffle=True)
val = DataLoader(TensorDataset(x[:20], y[:20]), batch_size=20)
model = nn.Sequential(OrderedDict(body=nn.Linear(8, 16), norm=nn.BatchNorm1d(16),
                                  fc=nn.Linear(16, 3)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
"""


def test_the_magic_flags(ip):
    ip.run_cell(SETUP).raise_error()
    with capture_output():
        ip.run_line_magic(
            "fine_tune", "model train --val val --epochs 1 --schedule one-cycle --bn train"
        )
    fits = torchmagic.notebook_session().fits
    assert [[c.name for c in h.schedules] for h in fits] == [["OneCycleLR"], ["OneCycleLR"]]
    assert ip.user_ns["optimizer"].param_groups[0]["lr"] == 0.05
    commands = [spelled(e.command, magic_line) for e in torchmagic.notebook_session().history()]
    assert commands[0] == "%freeze model --except fc --bn train"  # as the notebook spells it
    with pytest.raises(UsageError, match="--schedule takes one-cycle, got 'cosine'"):
        ip.run_line_magic("fine_tune", "model train --val val --epochs 1 --schedule cosine")


def test_a_tensor_lr_is_the_same_tensor_at_its_base_value_afterwards():
    model, _, train, val = build()
    lr = torch.tensor(1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)
    tm = Session(model, opt)
    tm.fine_tune(train, val=val, epochs=1, lr=4e-3, schedule="one-cycle")
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(1e-2)
    assert not any(key in g for g in opt.param_groups for key in SCHEDULE_KEYS)
