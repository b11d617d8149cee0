"""Schedulers that are not torch's: timm's family is followed like torch's (found by its
shape), schedulers held by other objects are found (``trainer.scheduler``), and anything
else that holds the optimizer and keeps per-group lists makes group-adding commands refuse."""


import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as S

from builders import named_mlp
from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.core.diagnostics.doctor import diagnose
from torchmagic.core.surgery import scheduler_sync

timm_scheduler = pytest.importorskip("timm.scheduler")

LR = 1e-2
X = 1e-3


def cosine(opt):
    return timm_scheduler.CosineLRScheduler(
        opt, t_initial=12, warmup_t=4, warmup_lr_init=1e-5, t_in_epochs=False
    )


def by_name(opt, name):
    return next(g for g in opt.param_groups if g.get("name") == name)


def test_timm_cosine_with_warmup_drives_the_unfrozen_block_like_the_head():
    model = named_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = cosine(opt)
    # the twin had body1 in its own group at base X from the start
    twin = named_mlp()
    body1 = list(twin.body1.parameters())
    rest = [p for p in twin.parameters() if all(p is not q for q in body1)]
    twin_opt = torch.optim.AdamW(
        [{"params": rest}, {"params": body1, "lr": X, "name": "body1"}], lr=LR
    )
    twin_sched = cosine(twin_opt)
    for t in range(2):  # in the warmup
        sched.step_update(t)
        twin_sched.step_update(t)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    tm.unfreeze("body1", lr=X)
    new, head = by_name(opt, "body1"), opt.param_groups[0]
    assert new["lr"] == pytest.approx(X * head["lr"] / LR)
    assert sched.base_values == [LR, X] and new["initial_lr"] == X
    seen = []
    for t in range(2, 12):  # the end of the warmup, then the cosine
        sched.step_update(t)
        twin_sched.step_update(t)
        assert new["lr"] == pytest.approx(by_name(twin_opt, "body1")["lr"], rel=1e-12)
        assert head["lr"] == pytest.approx(twin_opt.param_groups[0]["lr"], rel=1e-12)
        seen.append(new["lr"])
    assert max(seen) > 10 * min(seen) > 0  # not the constant lr of a group timm skips
    assert scheduler_sync.base_lr(opt, [sched], 1) == X


@pytest.mark.filterwarnings("ignore::FutureWarning")  # timm deprecates its plateau
def test_timm_plateau_extends_its_inner_torch_scheduler():
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = timm_scheduler.PlateauLRScheduler(opt, decay_rate=0.5, patience_t=0)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    tm.unfreeze("body1", lr=X)
    assert len(sched.base_values) == len(sched.lr_scheduler.min_lrs) == 2
    for epoch in range(3):
        sched.step(epoch, metric=1.0)
    assert opt.param_groups[1]["lr"] / X == pytest.approx(opt.param_groups[0]["lr"] / LR)


class Trainer:
    """A namespace object holding the training objects, as trainers do."""

    def __init__(self, optimizer, scheduler):
        self.optimizer = optimizer
        self.scheduler = scheduler


@pytest.mark.parametrize("make", [lambda o: S.StepLR(o, 2), cosine], ids=["torch", "timm"])
def test_scheduler_held_by_a_trainer_is_found(make):
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trainer = Trainer(opt, make(opt))
    tm = Session(namespace={"model": model, "optimizer": opt, "trainer": trainer})
    tm.freeze("body1")
    tm.unfreeze("body1", lr=X)
    lists = trainer.scheduler.base_values if hasattr(trainer.scheduler, "base_values") else None
    lists = lists or trainer.scheduler.base_lrs
    assert len(lists) == len(opt.param_groups) == 2 and lists[1] == X


class WarmupThing:
    """A hand-written scheduler torchmagic cannot follow: one peak per group."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.peaks = [g["lr"] for g in optimizer.param_groups]
        self.t = 0

    def step(self):
        self.t += 1
        for group, peak in zip(self.optimizer.param_groups, self.peaks, strict=True):
            group["lr"] = peak * min(1.0, self.t / 5)


def test_foreign_scheduler_refuses_adding_a_group_and_changes_nothing():
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ns = {"model": model, "optimizer": opt, "trainer": Trainer(opt, WarmupThing(opt))}
    tm = Session(namespace=ns)
    tm.freeze("body1")
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match=r"WarmupThing.*peaks"):
        tm.unfreeze("body1", lr=X)
    assert_same(before, snapshot(model, opt))
    tm.unfreeze("body1")  # back to its home group: no group added, allowed
    tm.replace_head("fc", 5)  # the new head joins the old head's group: allowed
    assert len(opt.param_groups) == 1
    ns["trainer"].scheduler.step()


def test_doctor_reports_foreign_and_out_of_step_timm_schedulers():
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ns = {"model": model, "optimizer": opt, "warmup": WarmupThing(opt)}
    assert any("WarmupThing" in f.message for f in diagnose(ns).findings)
    del ns["warmup"]
    ns["sched"] = cosine(opt)
    assert not [f for f in diagnose(ns).findings if f.check == "scheduler"]
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})  # by hand
    found = [f for f in diagnose(ns).findings if f.check == "scheduler"]
    assert found and "base_values has 1" in found[0].message
