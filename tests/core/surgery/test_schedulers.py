"""Every torch LR scheduler keeps stepping after %unfreeze / %replace_head, and the new
groups follow the schedule from their own base lr (tests/test_base_lr.py checks the values
step by step)."""


import pytest
import torch
from torch.optim import lr_scheduler as S

from builders import named_mlp
from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.core.surgery import scheduler_sync

SCHEDULERS = {
    "StepLR": lambda o: S.StepLR(o, step_size=2, gamma=0.5),
    "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[2, 4], gamma=0.5),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=20),
    "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3),
    "LambdaLR": lambda o: S.LambdaLR(o, lambda e: 0.95**e),
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda e: 0.95),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.5, total_iters=4),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=3),
    "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=20, power=2.0),
    "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=20),
    "CyclicLR": lambda o: S.CyclicLR(o, base_lr=0.001, max_lr=0.1, step_size_up=3),
    "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=0),
    "SequentialLR": lambda o: S.SequentialLR(
        o, [S.LinearLR(o, 0.5, total_iters=2), S.ExponentialLR(o, 0.9)], milestones=[3]
    ),
    "ChainedScheduler": lambda o: S.ChainedScheduler(
        [S.ConstantLR(o, 0.5, total_iters=4), S.ExponentialLR(o, 0.9)]
    ),
}


def train_step(model, opt, sched):
    opt.zero_grad()
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    if isinstance(sched, S.ReduceLROnPlateau):
        sched.step(1.0)  # never improves: the lr drops every step (patience 0)
    else:
        sched.step()


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_scheduler_keeps_working(name):
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = SCHEDULERS[name](opt)
    for _ in range(2):
        train_step(model, opt, sched)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    tm.replace_head("fc", 5)
    tm.unfreeze("body1", lr=1e-3)
    new, head = next(g for g in opt.param_groups if g.get("name") == "body1"), opt.param_groups[0]
    assert {id(p) for p in model.fc.parameters()} <= {id(p) for p in head["params"]}
    index = opt.param_groups.index(new)
    assert scheduler_sync.base_lr(opt, [sched], index) == pytest.approx(1e-3)  # lr=X is the base
    new_lr, head_lr = new["lr"], head["lr"]
    for _ in range(5):
        train_step(model, opt, sched)
        # the new group moves by the same factor as the head group
        assert new["lr"] / new_lr == pytest.approx(head["lr"] / head_lr, rel=1e-6)
    opt.state_dict()
    sched.state_dict()
    assert len(sched.get_last_lr()) == len(opt.param_groups)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_undo_restores_scheduler_lists(name):
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = SCHEDULERS[name](opt)
    train_step(model, opt, sched)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    tm.unfreeze("body1", lr=1e-3)
    tm.undo()
    assert len(opt.param_groups) == 1
    train_step(model, opt, sched)  # zips strictly against one group again


def test_a_schedule_at_zero_blocks_nothing():
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = S.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=2)
    for _ in range(2):
        train_step(model, opt, sched)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    tm.unfreeze("body1", lr=1e-3)
    new = opt.param_groups[-1]
    assert new["name"] == "body1" and new["lr"] == 0.0  # at the schedule's factor, 0
    assert new["initial_lr"] == 1e-3 and sched.base_lrs[-1] == 1e-3


def test_refuses_unknown_per_group_list():
    class Custom(S.LRScheduler):
        def __init__(self, optimizer):
            self.scales = [1.0] * len(optimizer.param_groups)
            super().__init__(optimizer)

        def get_lr(self):
            return [b * s for b, s in zip(self.base_lrs, self.scales, strict=True)]

    Custom.__module__ = "user_code"
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = Custom(opt)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="scales"):
        tm.unfreeze("body1", lr=1e-3)
    assert_same(before, snapshot(model, opt))
