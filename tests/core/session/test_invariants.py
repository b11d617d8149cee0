"""The post-condition after every command and undo: an edit that leaves the model, its
optimizer, schedulers or EMA copies inconsistent (a torchmagic bug, simulated here by
breaking an edit on purpose) is rolled back and said in one line."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn
from torch.optim.swa_utils import AveragedModel

from snapshots import assert_same, snapshot
from torchmagic import Session
from torchmagic.core.session import invariants
from torchmagic.core.session.invariants import BrokenInvariant
from torchmagic.core.surgery import edits, scheduler_sync
from torchmagic.core.surgery.optimizer_sync import OptimizerEditor


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def forgetful_add_group(monkeypatch):
    """An OptimizerEditor that forgets the last parameter of every group it adds."""
    real = OptimizerEditor.add_group

    def add_group(self, params, **kwargs):
        return real(self, list(params)[:-1], **kwargs)

    monkeypatch.setattr(OptimizerEditor, "add_group", add_group)


def test_an_edit_that_forgets_a_parameter_is_rolled_back_in_one_line(monkeypatch):
    model, opt, sched = build()
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("0")
    state, lists = snapshot(model, opt), list(sched.base_lrs)
    forgetful_add_group(monkeypatch)
    with pytest.raises(BrokenInvariant) as refused:
        tm.unfreeze("0", lr=1e-3)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("torchmagic bug, please report it: ")
    assert "parameter 0.bias is trainable but in no param group" in message
    assert "rolled back" in message
    assert_same(state, snapshot(model, opt))
    assert sched.base_lrs == lists
    assert len(tm.history()) == 1  # the freeze only
    assert model[0].weight not in {id(p) for g in opt.param_groups for p in g["params"]}


def test_a_scheduler_left_short_is_rolled_back(monkeypatch):
    model, opt, sched = build()
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("0")
    state, lists = snapshot(model, opt), list(sched.base_lrs)
    monkeypatch.setattr(scheduler_sync, "follow", lambda *args, **kwargs: None)
    with pytest.raises(BrokenInvariant, match=r"'schedulers\[0\]' out of step \(base_lrs has 1 "):
        tm.unfreeze("0", lr=1e-3)
    assert_same(state, snapshot(model, opt))
    assert sched.base_lrs == lists


def test_an_ema_copy_left_behind_is_rolled_back(monkeypatch):
    model, opt, _ = build()
    ema = AveragedModel(model)
    tm = Session(namespace={"model": model, "optimizer": opt, "ema": ema})
    state, ema_state = snapshot(model, opt), snapshot(ema.module)
    monkeypatch.setattr(edits, "_copy_heads", lambda copy, found, new, tx: [])
    with pytest.raises(BrokenInvariant, match="EMA copy 'ema' no longer shaped like its model"):
        tm.replace_head("4", 5)
    assert_same(state, snapshot(model, opt))
    assert_same(ema_state, snapshot(ema.module))


def test_the_magic_says_it_in_one_usage_error_line(ip, monkeypatch):
    model, opt, _ = build()
    ip.user_ns.update(model=model, optimizer=opt)
    ip.run_line_magic("freeze", "model.0")
    state = snapshot(model, opt)
    forgetful_add_group(monkeypatch)
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("unfreeze", "model.0 lr=1e-3")
    assert type(refused.value) is UsageError
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("torchmagic bug, please report it: %unfreeze model.0 lr=1e-3 left")
    assert_same(state, snapshot(model, opt))


def test_an_undo_that_breaks_it_says_so(monkeypatch):
    model, opt, _ = build()
    tm = Session(model, opt)
    tm.freeze("0")
    # a broken inverse, run last: the undo also takes out a parameter it never touched
    group = opt.param_groups[0]
    kept = model[4].bias
    tm._history.newest().tx._inverses.insert(
        0, lambda: group.update(params=[p for p in group["params"] if p is not kept])
    )
    with pytest.raises(BrokenInvariant, match=r"undo of tm.freeze\(\"0\"\) left parameter 4.bias"):
        tm.undo()


def test_what_the_user_set_up_that_way_is_not_blamed():
    """An optimizer built on the head alone while the rest still has requires_grad: the
    check counts only what a command changed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    tm = Session(model, opt)
    tm.unfreeze("2", lr=1e-3)
    tm.replace_head("2", 5)
    tm.undo()
    tm.undo()
    assert all(p.requires_grad for p in model.parameters())


def test_every_command_and_undo_passes_through_it(monkeypatch):
    pytest.importorskip("peft")
    model, opt, sched = build()
    ema = AveragedModel(model)
    tm = Session(namespace={"model": model, "optimizer": opt, "sched": sched, "ema": ema})
    calls: list[str] = []
    real = invariants.check

    def spy(target, before, command, undone=False, measured=None):
        calls.append(("undo " if undone else "") + command[0].method)
        return real(target, before, command, undone, measured)

    monkeypatch.setattr(invariants, "check", spy)
    tm.freeze("0-2")
    tm.unfreeze("2")
    tm.unfreeze("0", lr=1e-3)
    tm.set_base_lrs({0: 1e-3})
    tm.replace_head("4", 5)
    tm.lora("2", r=2)
    tm.lora_off()
    tm.lora_on()
    tm.merge_lora()
    for _ in range(9):
        tm.undo()
    made = ["freeze", "unfreeze", "unfreeze", "set_base_lrs", "replace_head", "lora"]
    made += ["lora_off", "lora_on", "merge_lora"]
    assert calls == [*made, *(f"undo {m}" for m in reversed(made))]
