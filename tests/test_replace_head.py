import pytest
import torch
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError


def test_new_head_lands_on_old_device_and_dtype():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    Session(model, opt).replace_head("auto", 5)
    head = model[3]
    assert head.out_features == 5 and head.in_features == 8
    assert head.weight.dtype == torch.float64 and head.weight.device.type == "cpu"


def test_old_head_leaves_optimizer_new_head_joins_its_group(trained):
    model, opt = trained
    old = model.fc
    change = Session(model, opt).replace_head("fc", 10)
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert not ids & {id(p) for p in old.parameters()}
    assert len(opt.param_groups) == 1  # the old head's group: no new group
    assert [id(p) for p in opt.param_groups[0]["params"][-2:]] == [
        id(p) for p in model.fc.parameters()
    ]
    assert all(old.weight is not p for p in opt.state)  # old state set aside
    assert change.effect.modules == ("fc",)


def test_second_replace_reuses_the_head_group(trained):
    model, opt = trained
    opt.param_groups[0]["params"] = [p for p in opt.param_groups[0]["params"] if p.ndim > 1]
    opt.add_param_group({"params": [model.fc.bias], "weight_decay": 0.0, "name": "head bias"})
    tm = Session(model, opt)
    tm.replace_head("fc", 10)
    n = len(opt.param_groups)
    tm.replace_head("auto", 4)
    assert len(opt.param_groups) == n and model.fc.out_features == 4
    assert opt.param_groups[-1]["params"] == [model.fc.bias]  # bias to the old bias's group
    assert opt.param_groups[0]["params"][-1] is model.fc.weight


def test_dropout_and_conv_head():
    import torchvision

    squeeze = torchvision.models.squeezenet1_1(weights=None)
    opt = torch.optim.SGD(squeeze.parameters(), lr=0.01)
    Session(squeeze, opt).replace_head("model.classifier", 6, dropout=0.3)
    new = squeeze.classifier[1]
    assert isinstance(new, nn.Sequential) and isinstance(new[0], nn.Dropout)
    assert new[0].p == 0.3 and isinstance(new[1], nn.Conv2d) and new[1].out_channels == 6
    assert squeeze(torch.randn(1, 3, 64, 64)).shape == (1, 6)


def test_undo_restores_head_and_state_exactly(trained):
    model, opt = trained
    old = model.fc
    before = snapshot(model, opt)
    tm = Session(model, opt)
    tm.replace_head("fc", 10)
    tm.undo()
    assert model.fc is old
    assert_same(before, snapshot(model, opt))


@pytest.mark.parametrize("n", [0, -3])
def test_bad_class_count(trained, n):
    model, opt = trained
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="positive integer"):
        Session(model, opt).replace_head("fc", n)
    assert_same(before, snapshot(model, opt))


def test_naming_a_non_head_layer_is_refused(trained):
    model, opt = trained
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="replaces Linear and Conv2d"):
        Session(model, opt).replace_head("model.bn1", 3)
    assert_same(before, snapshot(model, opt))
