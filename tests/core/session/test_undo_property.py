"""Property: any sequence of successful edits followed by as many undos restores the
model and optimizer exactly (weights, flags, modules, hooks, groups, state)."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from builders import cnn_with_decay_groups
from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError


def build():
    model, opt, sched = cnn_with_decay_groups()
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


TARGETS = ["stem", "block1", "block2", "block1-2", "*.1", "model", "fc", "block2.0"]
ops = st.one_of(
    st.tuples(
        st.just("freeze"),
        st.sampled_from(TARGETS),
        st.sampled_from(["eval", "train", "frozen"]),
        st.booleans(),
    ),
    st.tuples(
        st.just("unfreeze"),
        st.sampled_from(TARGETS),
        st.sampled_from([None, 1e-3, (1e-4, 1e-2)]),
        st.booleans(),
    ),
    st.tuples(
        st.just("replace_head"),
        st.sampled_from(["auto", "fc"]),
        st.integers(min_value=1, max_value=5),
        st.booleans(),
    ),
)


def apply(tm, op):
    kind, where, arg, dry = op
    if kind == "freeze":
        return tm.freeze(where, bn=arg, dry_run=dry)
    if kind == "unfreeze":
        return tm.unfreeze(where, lr=arg, dry_run=dry)
    return tm.replace_head(where, arg, dry_run=dry)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=6))
def test_edits_then_undos_restore_everything(sequence):
    model, opt, sched = build()
    before = snapshot(model, opt)
    lists_before = list(sched.base_lrs)
    tm = Session(model, opt, schedulers=[sched])
    done = 0
    for op in sequence:
        state = snapshot(model, opt)
        try:
            change = apply(tm, op)
        except TorchMagicError:
            assert_same(state, snapshot(model, opt))  # a refusal changes nothing
            continue
        if change.dry_run or change.unchanged:  # a no-op leaves no history entry
            assert_same(state, snapshot(model, opt))
        else:
            done += 1
            opt.state_dict()
            assert len(sched.base_lrs) == len(opt.param_groups)
    for _ in range(done):
        tm.undo()
    assert_same(before, snapshot(model, opt))
    assert sched.base_lrs == lists_before


def test_undo_keeps_the_schedule_of_groups_it_only_changed_members_of():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    tm = Session(model, opt, schedulers=[sched])
    tm.replace_head("auto", 7)  # the head leaves group 0: a membership change only
    opt.step()
    sched.step()
    tm.undo()
    assert opt.param_groups[0]["lr"] == 0.05  # training since is not rolled back
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.025
