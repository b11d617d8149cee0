"""The user's own param groups survive surgery: every parameter has a home group (where it
was when first seen, or when frozen). Groups are asserted by identity."""

import pytest
import torch
import torchvision
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, SessionConfig

timm_optim = pytest.importorskip("timm.optim")


def ids(params):
    return {id(p) for p in params}


def named(opt, name):
    return next(g for g in opt.param_groups if g.get("name") == name)


def holder(opt, p):
    return next(g for g in opt.param_groups if any(q is p for q in g["params"]))


@pytest.fixture
def timm_adamw(resnet):
    """resnet18 with timm's real factory: [no-decay (bias, norm) at 0, decay at 0.05]."""
    opt = timm_optim.create_optimizer_v2(resnet, "adamw", lr=1e-3, weight_decay=0.05)
    no_decay, decay = opt.param_groups
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.05
    return resnet, opt


def test_unfreeze_with_lr_keeps_decay_and_no_decay_apart(timm_adamw):
    model, opt = timm_adamw
    tm = Session(model, opt)
    tm.freeze("layer3")
    tm.unfreeze("layer3", lr=1e-4)
    conv = named(opt, "layer3")
    norm = named(opt, "layer3 · no_decay")
    layer3 = list(model.layer3.parameters())
    assert ids(conv["params"]) == ids(p for p in layer3 if p.ndim > 1)
    assert ids(norm["params"]) == ids(p for p in layer3 if p.ndim <= 1)
    assert conv["weight_decay"] == 0.05 and norm["weight_decay"] == 0.0
    assert conv["lr"] == norm["lr"] == 1e-4
    assert conv["betas"] == opt.param_groups[1]["betas"]


def test_unfreeze_without_lr_sends_parameters_home(timm_adamw):
    model, opt = timm_adamw
    no_decay, decay = opt.param_groups
    tm = Session(model, opt)
    tm.freeze("layer3")
    assert not ids(model.layer3.parameters()) & ids(decay["params"])
    tm.unfreeze("layer3")
    assert len(opt.param_groups) == 2
    for p in model.layer3.parameters():
        assert holder(opt, p) is (decay if p.ndim > 1 else no_decay)


def test_new_head_joins_the_groups_of_the_old_weight_and_bias(timm_adamw):
    model, opt = timm_adamw
    no_decay, decay = opt.param_groups
    Session(model, opt).replace_head("fc", 7)
    assert len(opt.param_groups) == 2
    assert holder(opt, model.fc.weight) is decay and holder(opt, model.fc.bias) is no_decay


def test_undo_of_split_unfreeze_is_exact(timm_adamw):
    model, opt = timm_adamw
    tm = Session(model, opt)
    tm.freeze("layer2-3")
    before = snapshot(model, opt)
    tm.unfreeze("layer2-3", lr=(1e-5, 1e-4))
    assert len(opt.param_groups) == 6
    tm.undo()
    assert_same(before, snapshot(model, opt))
    tm.unfreeze("layer2-3")
    assert len(opt.param_groups) == 2  # homes survived the undo


def test_param_groups_weight_decay_helper(resnet):
    groups = timm_optim.param_groups_weight_decay(resnet, weight_decay=0.01)
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    tm = Session(resnet, opt)
    tm.unfreeze("layer4", lr=1e-2)  # trainable already: moves out of its home groups
    assert named(opt, "layer4")["weight_decay"] == 0.01
    assert named(opt, "layer4 · no_decay")["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in named(opt, "layer4")["params"])


def backbone_head(model):
    """The tutorial's two groups: backbone at 1e-5 with its own betas, head at 1e-3."""
    head = list(model.fc.parameters())
    backbone = [p for p in model.parameters() if all(p is not q for q in head)]
    opt = torch.optim.AdamW(
        [
            {"params": backbone, "lr": 1e-5, "betas": (0.8, 0.99), "weight_decay": 1e-4},
            {"params": head, "lr": 1e-3, "weight_decay": 0.0},
        ]
    )
    return opt


def test_hand_built_groups_without_lr_return_to_the_backbone_lr(resnet):
    opt = backbone_head(resnet)
    backbone, head = opt.param_groups
    tm = Session(resnet, opt, config=SessionConfig(unfreeze_lr_ratio=0.1))
    tm.freeze("layer1-4")
    tm.unfreeze("layer3")
    assert ids(resnet.layer3.parameters()) <= ids(backbone["params"])
    assert backbone["lr"] == 1e-5 and len(opt.param_groups) == 2  # not 0.1 × 1e-3


def test_hand_built_groups_with_lr_copy_the_backbone_settings(resnet):
    opt = backbone_head(resnet)
    tm = Session(resnet, opt)
    tm.freeze("layer4")
    tm.unfreeze("layer4", lr=1e-4)
    g = named(opt, "layer4")
    assert ids(g["params"]) == ids(resnet.layer4.parameters())
    assert g["lr"] == 1e-4 and g["betas"] == (0.8, 0.99) and g["weight_decay"] == 1e-4


def test_home_is_the_group_at_freeze_time(resnet):
    opt = backbone_head(resnet)
    tm = Session(resnet, opt)
    tm.unfreeze("layer4", lr=1e-4)
    layer4 = named(opt, "layer4")
    tm.freeze("layer4")
    tm.unfreeze("layer4")
    assert ids(layer4["params"]) == ids(resnet.layer4.parameters())
    assert layer4["lr"] == 1e-4 and len(opt.param_groups) == 3


def test_parameters_never_in_a_group_take_the_defaults():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(
        [{"params": model[2].parameters(), "weight_decay": 0.0, "momentum": 0.5}],
        lr=0.1,
        momentum=0.9,
        weight_decay=5e-4,
    )
    Session(model, opt).unfreeze("0", lr=1e-2)
    g = named(opt, "0")
    assert g["weight_decay"] == 5e-4 and g["momentum"] == 0.9 and g["lr"] == 1e-2


def test_weight_decay_override_keeps_the_home_base_lr(resnet):
    opt = backbone_head(resnet)
    tm = Session(resnet, opt)
    tm.freeze("layer2")
    tm.unfreeze("layer2", wd=0.0)
    g = named(opt, "layer2")
    assert g["weight_decay"] == 0.0 and g["lr"] == 1e-5 and g["betas"] == (0.8, 0.99)


def test_undo_restores_a_group_emptied_by_a_homecoming():
    model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(model, opt)
    tm.unfreeze("features.12", lr=1e-3)
    before = snapshot(model, opt)
    tm.unfreeze("features.12")  # back to group 0; the block group stays, empty
    assert named(opt, "features.12")["params"] == []
    tm.undo()
    assert_same(before, snapshot(model, opt))


accelerate = pytest.importorskip("accelerate")


def _two_groups():
    """backbone (0, 2) at 1e-4, head (3) at 1e-3, after one AdamW step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 3))
    backbone = [*model[0].parameters(), *model[2].parameters()]
    opt = torch.optim.AdamW(
        [{"params": backbone, "lr": 1e-4}, {"params": list(model[3].parameters()), "lr": 1e-3}]
    )
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def _by_name(model, opt):
    """Each group's members (by name, in order) and hyper-parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [
        ([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
        for g in opt.param_groups
    ]


def test_unfreeze_after_prepare_goes_back_to_the_home_group():
    """%freeze before accelerator.prepare (which re-creates the group dicts), %unfreeze after."""
    model, opt = _two_groups()
    tm = Session(model, opt)
    tm.freeze("0")
    model, prepared = accelerate.Accelerator(cpu=True).prepare(model, opt)
    tm.unfreeze("0")

    hand_model, hand = _two_groups()  # the same by hand
    first = list(hand_model[0].parameters())
    backbone = hand.param_groups[0]
    backbone["params"] = [p for p in backbone["params"] if all(p is not q for q in first)]
    for p in first:
        del hand.state[p]
        p.requires_grad_(False)
    hand_model, hand_prepared = accelerate.Accelerator(cpu=True).prepare(hand_model, hand)
    for p in first:
        p.requires_grad_(True)
    hand.param_groups[0]["params"] += first

    assert len(opt.param_groups) == len(hand.param_groups) == 2
    assert _by_name(model, opt) == _by_name(hand_model, hand)
    assert [p.requires_grad for p in model.parameters()] == [
        p.requires_grad for p in hand_model.parameters()
    ]
    for p, q in zip(model[0].parameters(), first, strict=True):
        assert torch.equal(p, q) and p not in opt.state and q not in hand.state
    for p, q in zip(model[2].parameters(), hand_model[2].parameters(), strict=True):
        assert opt.state[p].keys() == hand.state[q].keys()
        assert all(torch.equal(opt.state[p][k], hand.state[q][k]) for k in opt.state[p])


def test_undo_of_a_head_swap_after_prepare_is_exact():
    model, opt = _two_groups()
    tm = Session(model, opt)
    before = snapshot(model, opt)
    tm.replace_head("3", 5)
    model, prepared = accelerate.Accelerator(cpu=True).prepare(model, opt)
    tm.undo()  # no "in a param group added since"
    assert_same(before, snapshot(model, opt))
