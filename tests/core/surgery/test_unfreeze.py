import pytest
import torch

from snapshots import assert_same, snapshot
from torchmagic import Session, SessionConfig, TorchMagicError


def group(opt, name):
    return next(g for g in opt.param_groups if g.get("name") == name)


def test_issue_sequence_leaves_layer4_training_at_its_lr(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("model.layer1-3")
    tm.replace_head("fc", 10)
    tm.unfreeze("layer4", lr=1e-4)
    g = group(opt, "layer4")
    assert g["lr"] == 1e-4 and g["weight_decay"] == 0.05
    assert [id(p) for p in g["params"]] == [id(p) for p in model.layer4.parameters()]
    owners = [i for i, gr in enumerate(opt.param_groups) for p in gr["params"]]
    assert len(owners) == len(set(id(p) for gr in opt.param_groups for p in gr["params"]))
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for gr in opt.param_groups for p in gr["params"]}


def test_moving_keeps_optimizer_state(trained):
    model, opt = trained
    state = {id(p): opt.state[p]["exp_avg"].clone() for p in model.layer4.parameters()}
    Session(model, opt).unfreeze("layer4", lr=1e-4)
    assert all(
        torch.equal(opt.state[p]["exp_avg"], state[id(p)]) for p in model.layer4.parameters()
    )


def test_discriminative_spread_in_module_order(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1-4")
    tm.unfreeze("layer2-4", lr=(1e-5, 1e-3))
    lrs = [group(opt, f"layer{i}")["lr"] for i in (2, 3, 4)]
    assert lrs == pytest.approx([1e-5, 1e-4, 1e-3])
    assert all(p.requires_grad for p in model.layer2.parameters())


def test_without_lr_parameters_return_to_their_home_group(trained):
    model, opt = trained
    tm = Session(model, opt, config=SessionConfig(unfreeze_lr_ratio=0.25))
    tm.freeze("layer3")
    tm.unfreeze("layer3")
    assert len(opt.param_groups) == 1  # back home: no new group, the group's own lr
    home = {id(p) for p in opt.param_groups[0]["params"]}
    assert {id(p) for p in model.layer3.parameters()} <= home
    assert opt.param_groups[0]["lr"] == 1e-3


def test_default_lr_for_parameters_never_in_a_group_is_ratio_of_head_base(resnet):
    for p in resnet.parameters():
        p.requires_grad_(False)
    resnet.fc.requires_grad_(True)
    opt = torch.optim.SGD(
        [{"params": resnet.fc.parameters(), "weight_decay": 0.0}],
        lr=0.2,
        momentum=0.9,
        weight_decay=5e-4,
    )
    Session(resnet, opt, config=SessionConfig(unfreeze_lr_ratio=0.25)).unfreeze("layer3")
    g = group(opt, "layer3")
    assert g["lr"] == pytest.approx(0.25 * 0.2)
    # never in any group: the optimizer's defaults, not the head group's weight decay
    assert g["weight_decay"] == 5e-4 and g["momentum"] == 0.9
    assert [id(p) for p in g["params"]] == [id(p) for p in resnet.layer3.parameters()]


def test_weight_decay_override(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer4")
    tm.unfreeze("layer4", lr=1e-4, wd=0.0)
    assert group(opt, "layer4")["weight_decay"] == 0.0


def test_refreeze_and_unfreeze_reuses_the_group(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.unfreeze("layer4", lr=1e-4)
    n = len(opt.param_groups)
    tm.freeze("layer4")
    tm.unfreeze("layer4", lr=3e-4)
    assert len(opt.param_groups) == n and group(opt, "layer4")["lr"] == 3e-4


def test_undo_of_unfreeze(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1-3")
    before = snapshot(model, opt)
    tm.unfreeze("layer2-3", lr=(1e-5, 1e-4))
    tm.undo()
    assert_same(before, snapshot(model, opt))


@pytest.mark.parametrize("lr", [-1.0, 0.0, float("nan"), float("inf"), (1e-5, -1.0)])
def test_bad_lr_changes_nothing(trained, lr):
    model, opt = trained
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError):
        Session(model, opt).unfreeze("layer4", lr=lr)
    assert_same(before, snapshot(model, opt))


def test_without_optimizer_only_flags(resnet):
    tm = Session(resnet)
    tm.freeze("layer1")
    change = tm.unfreeze("layer1")
    assert all(p.requires_grad for p in resnet.layer1.parameters())
    assert change.optimizer_name is None
    with pytest.raises(TorchMagicError, match="need an optimizer") as refused:
        tm.unfreeze("layer1", lr=1e-4)
    assert refused.value.param == "lr"
