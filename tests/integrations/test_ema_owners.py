"""EMA copies matched by ownership, not architecture: with two models of one
architecture, each with its EMA copy, an edit of one edits only its own copies; a copy whose
owner cannot be told refuses in one line and nothing changes."""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError


def net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(body=nn.Linear(6, 8), act=nn.ReLU(), fc=nn.Linear(8, 3)))


def _helpers():
    timm_utils = pytest.importorskip("timm.utils")
    return {
        "AveragedModel": AveragedModel,
        "AveragedModel-ema": lambda m: AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(0.9)),
        "ModelEmaV2": lambda m: timm_utils.ModelEmaV2(m, decay=0.9),
        "ModelEmaV3": lambda m: timm_utils.ModelEmaV3(m, decay=0.9),
    }


HELPERS = _helpers()


def update(ema, model: nn.Module) -> None:
    if isinstance(ema, AveragedModel):
        ema.update_parameters(model)
    else:
        ema.update(model)


def two_pairs(make, same_weights: bool = False) -> dict:
    """a and b of one architecture, each with its EMA copy under a name that says nothing
    of its model (``first``, ``second``)."""
    a, b = net(0), net(0 if same_weights else 1)
    return {
        "a": a,
        "b": b,
        "opt_a": torch.optim.SGD(a.parameters(), lr=0.1),
        "opt_b": torch.optim.SGD(b.parameters(), lr=0.1),
        "first": make(a),
        "second": make(b),
    }


def state(module: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("kind", HELPERS)
def test_replace_head_edits_only_the_edited_models_copy(kind):
    ns = two_pairs(HELPERS[kind])
    tm = Session(namespace=ns)
    theirs = state(ns["second"].module)
    mine = copy.deepcopy(ns["first"].module)  # the same edit by hand
    change = tm.replace_head("a.fc", 5, optimizer="opt_a")
    mine.fc = copy.deepcopy(ns["a"].fc)
    assert any("`first`" in n for n in change.effect.notes)
    assert not any("second" in n for n in change.effect.notes)
    edited = ns["first"].module.state_dict()
    assert edited.keys() == mine.state_dict().keys()
    assert all(torch.equal(edited[k], v) for k, v in mine.state_dict().items())
    after = ns["second"].module.state_dict()
    assert all(torch.equal(after[k], v) for k, v in theirs.items())
    update(ns["second"], ns["b"])  # b's copy still follows b
    update(ns["first"], ns["a"])
    assert ns["first"].module(torch.randn(2, 6)).shape == (2, 5)
    assert ns["second"].module(torch.randn(2, 6)).shape == (2, 3)


@pytest.mark.parametrize("kind", ["AveragedModel", "ModelEmaV3"])
def test_lora_edits_only_the_edited_models_copy(kind):
    pytest.importorskip("peft")
    ns = two_pairs(HELPERS[kind])
    tm = Session(namespace=ns)
    theirs = state(ns["second"].module)
    change = tm.lora("a.fc", r=2, optimizer="opt_a")
    assert any("`first`" in n for n in change.effect.notes)
    assert not any("second" in n for n in change.effect.notes)
    names = [n for n, _ in ns["first"].module.named_modules()]
    assert any("lora_A" in n for n in names)
    assert not any("lora" in n for n, _ in ns["second"].module.named_modules())
    after = ns["second"].module.state_dict()
    assert after.keys() == theirs.keys()
    assert all(torch.equal(after[k], v) for k, v in theirs.items())
    update(ns["second"], ns["b"])


def test_the_copys_name_decides_when_the_weights_cannot():
    ns = two_pairs(AveragedModel, same_weights=True)
    ns["ema_b"], ns["ema_a"] = ns.pop("second"), ns.pop("first")
    change = Session(namespace=ns).replace_head("a.fc", 5, optimizer="opt_a")
    assert any("`ema_a`" in n for n in change.effect.notes)
    assert ns["ema_b"].module.fc.out_features == 3 and ns["ema_a"].module.fc.out_features == 5


def test_the_owner_is_kept_from_first_sight_after_the_copies_move():
    ns = two_pairs(HELPERS["ModelEmaV3"])
    tm = Session(namespace=ns)
    tm.freeze("a.body", optimizer="opt_a")  # first sight: the copies equal their models
    for model, ema in (("a", "first"), ("b", "second")):
        ns[model].fc.weight.data.add_(1.0)
        update(ns[ema], ns[model])  # values no longer equal any model
    change = tm.replace_head("a.fc", 5, optimizer="opt_a")
    assert any("`first`" in n for n in change.effect.notes)
    assert ns["second"].module.fc.out_features == 3


@pytest.mark.parametrize("magic", [False, True])
def test_an_unplaced_copy_refuses_in_one_line_and_nothing_changes(ip, magic):
    ns = two_pairs(HELPERS["ModelEmaV2"])
    for model, ema in (("a", "first"), ("b", "second")):
        ns[model].fc.weight.data.add_(1.0)
        update(ns[ema], ns[model])  # neither weights nor names tell whose
    before = [snapshot(ns["a"], ns["opt_a"]), snapshot(ns["b"], ns["opt_b"])]
    copies = [state(ns["first"].module), state(ns["second"].module)]
    if magic:
        ip.user_ns.update(ns)
        with pytest.raises(UsageError) as info:
            ip.run_line_magic("replace_head", "a.fc 5 --opt opt_a")
        assert type(info.value) is UsageError
    else:
        with pytest.raises(TorchMagicError) as info:
            Session(namespace=ns).replace_head("a.fc", 5, optimizer="opt_a")
    message = str(info.value)
    assert "\n" not in message and "'first'" in message and "ema_a" in message
    assert_same(before[0], snapshot(ns["a"], ns["opt_a"]))
    assert_same(before[1], snapshot(ns["b"], ns["opt_b"]))
    for kept, ema in zip(copies, ("first", "second"), strict=True):
        now = ns[ema].module.state_dict()
        assert all(torch.equal(now[k], v) for k, v in kept.items())
