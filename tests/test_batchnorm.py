import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from snapshots import assert_same, snapshot
from torchmagic import Session


def test_eval_policy_holds_running_stats_after_train(trained):
    model, opt = trained
    Session(model, opt).freeze("layer1")
    model.train()
    bn = model.layer1[0].bn1
    mean = bn.running_mean.clone()
    model(torch.randn(4, 3, 32, 32))
    assert torch.equal(bn.running_mean, mean) and not bn.training
    assert model.bn1.training  # outside the frozen block BN still trains
    before = model.layer4[0].bn1.running_mean.clone()
    model(torch.randn(4, 3, 32, 32))
    assert not torch.equal(model.layer4[0].bn1.running_mean, before)


def test_unfreeze_releases_bn(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1")
    tm.unfreeze("layer1")
    model.train()
    bn = model.layer1[0].bn1
    mean = bn.running_mean.clone()
    model(torch.randn(4, 3, 32, 32))
    assert bn.training and not torch.equal(bn.running_mean, mean)


def test_train_policy_leaves_bn_alone(trained):
    model, opt = trained
    Session(model, opt).freeze("layer1", bn="train")
    model.train()
    bn = model.layer1[0].bn1
    mean = bn.running_mean.clone()
    model(torch.randn(4, 3, 32, 32))
    assert not torch.equal(bn.running_mean, mean)


def test_frozen_policy_swaps_and_keeps_outputs(trained):
    model, opt = trained
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    expected = model(x)
    old_bn = model.layer2[0].bn1
    before = snapshot(model, opt)
    tm = Session(model, opt)
    change = tm.freeze("layer2", bn="frozen")
    assert isinstance(model.layer2[0].bn1, FrozenBatchNorm2d)
    assert change.effect.bn_modes == {"frozen": 5}
    assert not {id(p) for p in old_bn.parameters()} & {
        id(p) for g in opt.param_groups for p in g["params"]
    }
    assert torch.allclose(model(x), expected, atol=1e-5)
    tm.undo()
    assert model.layer2[0].bn1 is old_bn
    assert_same(before, snapshot(model, opt))


def test_unfreeze_turns_frozen_bn_back_into_trainable_bn(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer2", bn="frozen")
    tm.unfreeze("layer2", lr=1e-4)
    bn = model.layer2[0].bn1
    assert type(bn) is torch.nn.BatchNorm2d and bn.weight.requires_grad
    group = next(g for g in opt.param_groups if g.get("name") == "layer2")
    assert any(p is bn.weight for p in group["params"])
