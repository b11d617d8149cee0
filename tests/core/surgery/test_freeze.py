import pytest
import torch

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError


def in_groups(opt):
    return {id(p) for g in opt.param_groups for p in g["params"]}


def test_freeze_flags_grads_groups_and_state(trained):
    model, opt = trained
    frozen = [p for n, p in model.named_parameters() if n.startswith(("layer1", "layer2"))]
    state_before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in frozen}
    change = Session(model, opt).freeze("layer1-2")
    assert all(not p.requires_grad and p.grad is None for p in frozen)
    assert not in_groups(opt) & {id(p) for p in frozen}
    assert all(p not in opt.state for p in frozen)  # state set aside, not lost
    assert change.after.frozen == sum(p.numel() for p in frozen)
    assert change.effect.modules == ("layer1", "layer2")
    opt.state_dict()  # still serialisable
    assert state_before  # the trained fixture really had state


def test_undo_restores_state_bit_exact(trained):
    model, opt = trained
    before = snapshot(model, opt)
    tm = Session(model, opt)
    tm.freeze("layer1-3")
    tm.undo()
    after = snapshot(model, opt)
    # grads were dropped on purpose (memory); everything else is back exactly
    assert_same(before, after)


def test_training_after_freeze_moves_only_trainable(trained):
    model, opt = trained
    Session(model, opt).freeze("layer1-3")
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    live = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt.zero_grad()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in frozen.items())
    assert any(not torch.equal(params[n], v) for n, v in live.items())


def test_dry_run_changes_nothing(trained):
    model, opt = trained
    before = snapshot(model, opt)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    tm = Session(model, opt)
    change = tm.freeze("layer1-3", bn="frozen", dry_run=True)
    assert change.dry_run and change.after.frozen > 0
    assert_same(before, snapshot(model, opt))
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
    assert tm.history() == ()


def test_whole_model_except_head(trained):
    model, opt = trained
    change = Session(model, opt).freeze(exclude=["fc"])
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["fc.weight", "fc.bias"]
    assert in_groups(opt) == {id(model.fc.weight), id(model.fc.bias)}
    assert change.after.trainable == model.fc.weight.numel() + model.fc.bias.numel()


def test_emptied_group_is_kept_for_schedulers(trained):
    model, opt = trained
    Session(model, opt).freeze("model")
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == []
    opt.step()
    opt.state_dict()


def test_parameterless_target_refused(trained):
    model, opt = trained
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="has no parameters"):
        Session(model, opt).freeze("relu")
    assert_same(before, snapshot(model, opt))


def test_failure_midway_rolls_back(trained, monkeypatch):
    model, opt = trained
    before = snapshot(model, opt)
    from torchmagic.core.surgery import batchnorm

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(batchnorm, "apply", boom)
    with pytest.raises(RuntimeError, match="injected"):
        Session(model, opt).freeze("layer1-3")
    assert_same(before, snapshot(model, opt))


def test_param_names_groups_kept_in_step():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.named_parameters(), lr=0.1)
    tm = Session(model, opt)
    tm.freeze("0")
    assert opt.param_groups[0]["param_names"] == ["1.weight", "1.bias"]
    tm.unfreeze("0", lr=0.01)
    assert opt.param_groups[1]["param_names"] == ["0.weight", "0.bias"]
    opt.state_dict()


def test_undo_after_the_model_moved_puts_state_where_the_parameters_are(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1")
    moved = list(model.layer1.parameters())
    with torch.no_grad():
        for p in moved:  # as %device move does: the same Parameter objects, on a new device
            torch.utils.swap_tensors(p, torch.nn.Parameter(p.to("meta"), p.requires_grad))
    tm.undo()
    for p in moved:
        assert opt.state[p]["exp_avg"].device.type == "meta"
        assert opt.state[p]["step"].device.type == "cpu"  # Adam's step stays on the host
