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


def test_frozen_then_unfreeze_restores_the_original_batchnorm_settings():
    import torchvision

    model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bn = model.features[1].block[0][1]
    assert (bn.momentum, bn.eps) == (0.01, 0.001)
    tm = Session(model, opt)
    tm.freeze("features.1", bn="frozen")
    frozen = model.features[1].block[0][1]
    assert isinstance(frozen, FrozenBatchNorm2d)
    with torch.no_grad():
        frozen.running_mean.fill_(0.5)  # e.g. a checkpoint loaded while frozen
    tm.unfreeze("features.1")
    back = model.features[1].block[0][1]
    assert type(back) is torch.nn.BatchNorm2d and back.momentum == 0.01 and back.eps == 0.001
    assert back.affine and back.track_running_stats and back.weight.requires_grad
    assert torch.equal(back.running_mean, torch.full_like(back.running_mean, 0.5))
    assert any(p is back.weight for p in opt.param_groups[0]["params"])  # its home group


def test_frozen_then_unfreeze_keeps_affine_false_and_cumulative_momentum():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, affine=False, momentum=None)
    )
    no_stats = torch.nn.BatchNorm2d(4, track_running_stats=False)
    model.append(no_stats)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(model, opt)
    change = tm.freeze(bn="frozen")
    assert isinstance(model[1], FrozenBatchNorm2d)
    assert model[2] is no_stats  # no running statistics to freeze: held in eval instead
    assert change.effect.bn_modes == {"frozen": 1, "held": 1}
    tm.unfreeze()
    bn = model[1]
    assert type(bn) is torch.nn.BatchNorm2d and not bn.affine and bn.momentum is None
    assert bn.weight is None and model[2] is no_stats and not no_stats.track_running_stats


def test_frozen_policy_says_which_batchnorm_kinds_it_held_in_eval_instead():
    """timm's BatchNormAct2d (EfficientNet, MobileNetV3…) is not a plain BatchNorm2d:
    `--bn frozen` holds it in eval, and says so instead of reading as if it were swapped."""
    from torch import nn

    class BatchNormAct2d(nn.BatchNorm2d):  # the shape of timm's: a BatchNorm2d subclass
        pass

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), BatchNormAct2d(4), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2)
    )
    model(torch.randn(2, 3, 8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    change = Session(model, opt).freeze("0-2", bn="frozen")
    assert isinstance(model[2], FrozenBatchNorm2d)
    assert type(model[1]) is BatchNormAct2d and not model[1].training
    assert "--bn frozen swaps BatchNorm2d only: 1 BatchNormAct2d held in eval instead" in (
        change.effect.notes
    )


def test_bn_frozen_swaps_the_ema_copys_layers_too_and_undo_puts_both_back():
    """An AveragedModel copy stays shaped like its model: its BatchNorm2d at the same
    places becomes a FrozenBatchNorm2d holding the copy's own averages (as a user would
    swap both by hand), unfreeze swaps both back, and undo restores the very modules."""
    import torchvision
    from torch.optim.swa_utils import AveragedModel

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=4)
    ema = AveragedModel(model)
    with torch.no_grad():
        ema.module.layer1[0].bn1.running_mean.add_(1.0)  # the copy's own statistics
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ns = {"model": model, "opt": opt, "ema": ema}
    tm = Session(namespace=ns)
    original_model_bn, original_copy_bn = model.layer1[0].bn1, ema.module.layer1[0].bn1
    tm.freeze("model.layer1", bn="frozen")
    swapped = ema.module.layer1[0].bn1
    assert isinstance(model.layer1[0].bn1, FrozenBatchNorm2d)
    assert isinstance(swapped, FrozenBatchNorm2d)
    assert torch.equal(swapped.running_mean, original_copy_bn.running_mean)
    assert ema.module.state_dict().keys() == model.state_dict().keys()
    tm.undo()
    assert model.layer1[0].bn1 is original_model_bn and ema.module.layer1[0].bn1 is original_copy_bn
    tm.freeze("model.layer1", bn="frozen")
    tm.unfreeze("model.layer1")
    assert type(model.layer1[0].bn1) is torch.nn.BatchNorm2d
    assert type(ema.module.layer1[0].bn1) is torch.nn.BatchNorm2d
    assert torch.equal(ema.module.layer1[0].bn1.running_mean, original_copy_bn.running_mean)
    assert ema.module.state_dict().keys() == model.state_dict().keys()
