"""`lr=X` is the base lr of the new group: its lr is X times the schedule's present factor
(reference group's lr / reference group's base lr) at the command and at every step after,
through restarts, warmup ends and cycle peaks, for each of torch's 15 schedulers."""


import pytest
import torch
from torch.optim import lr_scheduler as S

from builders import named_mlp
from torchmagic import Session
from torchmagic.core.surgery import scheduler_sync

LR = 0.05  # the optimizer's lr: the base of every schedule but the two cyclic ones
X = 1e-3  # the base lr typed for the unfrozen block


# name: (build, steps before the command, steps after, the reference group's base lr)
CASES = {
    "StepLR": (lambda o: S.StepLR(o, step_size=3, gamma=0.5), 2, 6, LR),
    "MultiStepLR": (lambda o: S.MultiStepLR(o, milestones=[3, 6], gamma=0.5), 2, 6, LR),
    "ExponentialLR": (lambda o: S.ExponentialLR(o, gamma=0.9), 2, 5, LR),
    "CosineAnnealingLR": (lambda o: S.CosineAnnealingLR(o, T_max=10), 4, 10, LR),
    # nine steps in, the next step restarts at the full base (was 41x the typed lr)
    "CosineAnnealingWarmRestarts": (lambda o: S.CosineAnnealingWarmRestarts(o, T_0=10), 9, 6, LR),
    "LambdaLR": (lambda o: S.LambdaLR(o, lambda e: min(1.0, (e + 1) / 5)), 2, 6, LR),  # warmup
    "MultiplicativeLR": (lambda o: S.MultiplicativeLR(o, lambda e: 0.9), 2, 5, LR),
    "LinearLR": (lambda o: S.LinearLR(o, start_factor=0.1, total_iters=5), 2, 6, LR),
    "ConstantLR": (lambda o: S.ConstantLR(o, factor=0.5, total_iters=4), 2, 5, LR),
    "PolynomialLR": (lambda o: S.PolynomialLR(o, total_iters=10, power=2.0), 3, 5, LR),
    "OneCycleLR": (
        lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=20, pct_start=0.3),
        3,
        10,
        0.1,
    ),
    "CyclicLR": (
        lambda o: S.CyclicLR(o, base_lr=0.001, max_lr=0.1, step_size_up=3),
        1,
        8,
        0.1,
    ),
    "SequentialLR": (
        lambda o: S.SequentialLR(
            o, [S.LinearLR(o, 0.1, total_iters=3), S.CosineAnnealingLR(o, T_max=10)], [3]
        ),
        2,
        6,
        LR,
    ),
    "ChainedScheduler": (
        lambda o: S.ChainedScheduler(
            [S.ConstantLR(o, 0.5, total_iters=4), S.ExponentialLR(o, 0.9)]
        ),
        2,
        5,
        LR,
    ),
}


def train_step(model, opt, sched):
    opt.zero_grad()
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    if isinstance(sched, S.ReduceLROnPlateau):
        sched.step(1.0)  # never improves: every group's lr halves every step (patience 0)
    else:
        sched.step()


def setup(build, steps):
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = build(opt)
    for _ in range(steps):
        train_step(model, opt, sched)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    tm.unfreeze("body1", lr=X)
    new = next(g for g in opt.param_groups if g.get("name") == "body1")
    return model, opt, sched, new, opt.param_groups[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_new_group_lr_is_base_times_the_schedule_factor(name):
    build, before, after, ref_base = CASES[name]
    model, opt, sched, new, ref = setup(build, before)
    factors = set()
    for step in range(after + 1):
        factor = ref["lr"] / ref_base
        factors.add(round(factor, 6))
        assert new["lr"] == pytest.approx(X * factor, rel=1e-9, abs=1e-15), f"step {step}"
        if step < after:
            train_step(model, opt, sched)
    assert len(factors) > 1  # the schedule did move while we watched
    index = opt.param_groups.index(new)
    assert scheduler_sync.base_lr(opt, [sched], index) == pytest.approx(X)
    sched.state_dict()
    opt.state_dict()


def test_reduce_on_plateau_keeps_x_now_then_the_same_reductions():
    model, opt, sched, new, ref = setup(lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=0), 2)
    assert new["lr"] == X
    ref_then = ref["lr"]
    for _ in range(4):
        train_step(model, opt, sched)
        assert new["lr"] / X == pytest.approx(ref["lr"] / ref_then)
    assert len(sched.min_lrs) == len(opt.param_groups)
    assert scheduler_sync.base_lr(opt, [sched], 0) == ref["lr"]  # plateau: the lr now


def test_warm_restart_gives_the_typed_lr_not_41x():
    """The issue's case: CosineAnnealingWarmRestarts nine steps in."""
    model, opt, sched, new, ref = setup(lambda o: S.CosineAnnealingWarmRestarts(o, T_0=10), 9)
    assert new["lr"] == pytest.approx(X * (ref["lr"] / LR))  # 2.45e-5 now
    train_step(model, opt, sched)  # the restart
    assert ref["lr"] == pytest.approx(LR)
    assert new["lr"] == pytest.approx(X)


def test_warmup_at_factor_zero_blocks_nothing():
    model = named_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = S.LambdaLR(opt, lambda e: e / 4)  # lr 0 on the first step
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("body1")
    tm.replace_head("fc", 5)
    tm.unfreeze("body1", lr=X)
    new = opt.param_groups[-1]
    assert new["name"] == "body1" and new["lr"] == 0.0
    for _ in range(4):
        train_step(model, opt, sched)
    assert new["lr"] == pytest.approx(X) and opt.param_groups[0]["lr"] == pytest.approx(LR)
    assert all(p.requires_grad for p in model.fc.parameters())


def test_base_lr_without_scheduler_is_the_lr():
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    Session(model, opt).unfreeze("body1", lr=X)
    assert opt.param_groups[-1]["lr"] == X
    assert scheduler_sync.base_lr(opt, [], len(opt.param_groups) - 1) == X
    assert scheduler_sync.schedule_name([]) is None


def test_schedule_name_is_the_stepped_scheduler():
    opt = torch.optim.SGD(named_mlp().parameters(), lr=LR)
    seq = S.SequentialLR(opt, [S.LinearLR(opt, 0.1, total_iters=2), S.ExponentialLR(opt, 0.9)], [2])
    assert scheduler_sync.schedule_name(scheduler_sync.flatten([seq])) == "SequentialLR"


def test_discriminative_spread_values_are_bases():
    model = named_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = S.CosineAnnealingWarmRestarts(opt, T_0=10)
    for _ in range(5):
        train_step(model, opt, sched)
    factor = opt.param_groups[0]["lr"] / LR
    Session(model, opt, schedulers=[sched]).unfreeze("body1", "body2", lr=(1e-4, 1e-2))
    groups = {g.get("name"): g for g in opt.param_groups}
    assert groups["body1"]["lr"] == pytest.approx(1e-4 * factor)
    assert groups["body2"]["lr"] == pytest.approx(1e-2 * factor)
    assert sched.base_lrs[-2:] == pytest.approx([1e-4, 1e-2])


def _per_block_groups(model: torch.nn.Module) -> torch.optim.Optimizer:
    names = ["body1", "body2", "fc"]
    return torch.optim.AdamW(
        [{"params": list(getattr(model, n).parameters()), "name": n} for n in names], lr=LR
    )


def _steps(opt: torch.optim.Optimizer, sched, n: int) -> None:
    for _ in range(n):
        opt.step()
        sched.step()


def test_an_emptied_group_refilled_with_lr_follows_the_schedule_as_by_hand():
    """Freeze all but the head (the block's own group is emptied, kept for the schedule),
    then lr= refills that group: base X, lr now X times the schedule's factor, the same
    ratio to the head at every step after, exactly as the same edit written by hand."""
    model = named_mlp()
    opt = _per_block_groups(model)
    sched = S.CosineAnnealingLR(opt, T_max=10)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze(exclude=["fc"])
    _steps(opt, sched, 3)
    tm.unfreeze("body2", lr=X)

    hand = named_mlp()
    hand_opt = _per_block_groups(hand)
    hand_sched = S.CosineAnnealingLR(hand_opt, T_max=10)
    for name in ("body1", "body2"):
        for p in getattr(hand, name).parameters():
            p.requires_grad_(False)
        hand_opt.param_groups[["body1", "body2"].index(name)]["params"] = []
    _steps(hand_opt, hand_sched, 3)
    group = hand_opt.param_groups[1]
    group["params"] = list(hand.body2.parameters())
    for p in group["params"]:
        p.requires_grad_(True)
    factor = hand_opt.param_groups[2]["lr"] / hand_sched.base_lrs[2]
    group["initial_lr"], group["lr"] = X, X * factor
    hand_sched.base_lrs[1] = X
    hand_sched._last_lr = [g["lr"] for g in hand_opt.param_groups]

    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in hand_opt.param_groups]
    assert sched.base_lrs == hand_sched.base_lrs
    assert opt.param_groups[1]["lr"] < X  # not X itself: the schedule has moved on
    _steps(opt, sched, 4)
    _steps(hand_opt, hand_sched, 4)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in hand_opt.param_groups]
    assert opt.param_groups[1]["lr"] / opt.param_groups[2]["lr"] == pytest.approx(X / LR)
