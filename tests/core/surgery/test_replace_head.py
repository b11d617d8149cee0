import re

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


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("model.bn1", "it is a BatchNorm2d; a head is a Linear"),
        ("layer4", "layer4.1.downsample|layer4.0.downsample"),  # its last 1x1 conv
        ("layer4.1.conv2", "Conv2d 3x3"),
        ("layer4.0.downsample.0", "not the model's output"),  # a 1x1 conv, mid-backbone
    ],
)
def test_naming_a_non_head_is_refused_and_lists_the_head(trained, where, why):
    model, opt = trained
    before = snapshot(model, opt)
    tm = Session(model, opt)
    with pytest.raises(TorchMagicError, match="is not a head") as info:
        tm.replace_head(where, 3)
    message = str(info.value)
    assert re.search(why, message), message
    assert "Heads of ResNet: fc (Linear 512→1000)" in message
    assert info.value.param == "where"
    assert_same(before, snapshot(model, opt))
    assert tm.history() == ()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)  # the backbone still works


def test_bottleneck_1x1_conv_is_refused_by_the_meta_forward():
    """layer4.2.conv3 of a ResNet-50 is a 1x1 Conv2d: only running the model shows that
    bn3 follows it. The forward runs on the meta device: weights and statistics stay."""
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    before = snapshot(model)
    with pytest.raises(TorchMagicError, match="layer4.2.conv3.*not the model's output"):
        Session(model).replace_head("layer4.2.conv3", 3)
    assert_same(before, snapshot(model))


class Backwards(nn.Module):
    """The head is registered first and runs last: only a forward tells."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(8, 5)
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.proj(self.body(x).mean((2, 3)))))


def test_custom_model_head_is_found_by_the_meta_forward():
    model = Backwards()
    running_mean = model.body[1].running_mean.clone()
    change = Session(model).replace_head("auto", 4)
    assert change.effect.modules == ("out",)
    assert model.out.out_features == 4 and model.proj.out_features == 8
    assert torch.equal(model.body[1].running_mean, running_mean)  # the probe ran on meta
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 4)


class Caching(Backwards):
    """Caches a tensor on its first forward, as rotary embeddings do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "scale", None) is None:
            self.scale = torch.ones(8, device=x.device)
        return self.out(torch.relu(self.proj(self.body(x).mean((2, 3)) * self.scale)))


def test_the_meta_forward_leaves_no_meta_tensor_behind():
    model = Caching()
    assert Session(model).replace_head("auto", 4).effect.modules == ("out",)
    assert not hasattr(model, "scale")
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 4)
    assert model.scale.device.type == "cpu"


def test_custom_model_non_head_linear_is_refused():
    model = Backwards()
    before = snapshot(model)
    with pytest.raises(TorchMagicError, match="'proj' is not a head.*Heads of Backwards: out"):
        Session(model).replace_head("proj", 4)
    assert_same(before, snapshot(model))


class TwoInputs(nn.Module):
    """A forward no guessed input can run: the last layer with parameters is the head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(x) * mask)


def test_model_the_probe_cannot_run_falls_back_to_the_last_layer():
    model = TwoInputs()
    assert Session(model).replace_head("auto", 6).effect.modules == ("out",)
    assert model(torch.randn(2, 4), torch.ones(2, 1)).shape == (2, 6)
    with pytest.raises(TorchMagicError, match="'embed' is not a head"):
        Session(model).replace_head("embed", 6)


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.age = nn.Linear(8, 1)
        self.kind = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.kind(h), self.age(h)


def test_two_output_layers_must_be_named():
    """Both heads' outputs are returned as they are: the meta forward sees each one."""
    model = TwoOutputs()
    with pytest.raises(TorchMagicError, match="several outputs, each made by a head: age, kind"):
        Session(model).replace_head("auto", 5)
    assert Session(model).replace_head("kind", 5).effect.modules == ("kind",)
    assert Session(model).replace_head("age", 2).effect.modules == ("age",)
    kind, age = model(torch.randn(2, 4))
    assert kind.shape == (2, 5) and age.shape == (2, 2)
    with pytest.raises(TorchMagicError, match="'body' is not a head"):
        Session(model).replace_head("body", 5)


def test_sequential_hidden_linear_is_refused():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(TorchMagicError, match="'1' is not a head.*Heads of Sequential: 3"):
        Session(model).replace_head("1", 5)
    assert model[1].out_features == 8
