"""Attribute paths work when other variables name the same objects: the namespace walk
names each object once, by its shortest path, and a longer path still reaches it."""

import types

import pytest
import torch

from builders import resnet18_sgd
from snapshots import assert_same, snapshot
from torchmagic import Session


def _learner():
    model, opt = resnet18_sgd()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    return types.SimpleNamespace(model=model, opt=opt)


def _freeze_layer1_by_hand(model, opt):
    layer1 = list(model.layer1.parameters())
    group = opt.param_groups[0]
    group["params"] = [p for p in group["params"] if all(p is not q for q in layer1)]
    for p in layer1:
        p.requires_grad_(False)
        p.grad = None
        del opt.state[p]


def _same_edit(learner, hand):
    assert [p.requires_grad for p in learner.model.parameters()] == [
        p.requires_grad for p in hand.model.parameters()
    ]
    names = {id(p): n for n, p in learner.model.named_parameters()}
    hand_names = {id(p): n for n, p in hand.model.named_parameters()}
    assert [[names[id(p)] for p in g["params"]] for g in learner.opt.param_groups] == [
        [hand_names[id(p)] for p in g["params"]] for g in hand.opt.param_groups
    ]
    assert sorted(names[id(p)] for p in learner.opt.state) == sorted(
        hand_names[id(p)] for p in hand.opt.state
    )
    for p, q in zip(learner.model.parameters(), hand.model.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("aliases", [("model",), ("optimizer",), ("model", "optimizer")])
def test_magic_freeze_through_attribute_paths_beside_aliases(ip, aliases):
    learner, hand = _learner(), _learner()
    ns = {"model": learner.model, "optimizer": learner.opt}
    ip.user_ns.update(learner=learner, **{k: ns[k] for k in aliases})
    ip.run_line_magic("freeze", "learner.model.layer1 --opt learner.opt")
    _freeze_layer1_by_hand(hand.model, hand.opt)
    _same_edit(learner, hand)


def test_session_freeze_and_undo_through_an_alias():
    learner = _learner()
    before = snapshot(learner.model, learner.opt)
    tm = Session(namespace={"learner": learner, "model": learner.model, "optimizer": learner.opt})
    change = tm.freeze("learner.model.layer1", optimizer="learner.opt")
    assert change.model_name == "learner.model" and change.optimizer_name == "learner.opt"
    hand = _learner()
    _freeze_layer1_by_hand(hand.model, hand.opt)
    _same_edit(learner, hand)
    tm.undo()
    assert_same(before, snapshot(learner.model, learner.opt))


def test_second_name_for_the_holder_itself(ip):
    """``l2 = learner``: the walk names the object once, as ``learner``."""
    learner, hand = _learner(), _learner()
    ip.user_ns.update(learner=learner, l2=learner, model=learner.model)
    ip.run_line_magic("freeze", "l2.model.layer1 --opt l2.opt")
    _freeze_layer1_by_hand(hand.model, hand.opt)
    _same_edit(learner, hand)


def test_a_path_to_nothing_is_one_line(ip):
    learner = _learner()
    ip.user_ns.update(learner=learner, model=learner.model)
    before = snapshot(learner.model, learner.opt)
    with pytest.raises(Exception) as caught:
        ip.run_line_magic("freeze", "learner.modle.layer1 --opt learner.opt")
    assert "\n" not in str(caught.value).strip()
    assert_same(before, snapshot(learner.model, learner.opt))
