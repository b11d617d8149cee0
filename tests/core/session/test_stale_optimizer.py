"""A stale optimizer is refused, never used: one that holds none of the
model's current parameters — the model cell re-run but not the optimizer cell, or
``optimizer=NAME`` naming another model's optimizer."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn

import torchmagic
from torchmagic import Session, TorchMagicError
from torchmagic.core.diagnostics.doctor import diagnose

NOTEBOOK = """
import torch
from collections import OrderedDict
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict([
        ("0", nn.Linear(4, 8)), ("relu", nn.ReLU()), ("layer3", nn.Linear(8, 3)),
    ]))

x = torch.randn(32, 4)
y = torch.randint(0, 3, (32,))
train_loader = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
model = make(); optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
"""


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict([("0", nn.Linear(4, 8)), ("relu", nn.ReLU()), ("layer3", nn.Linear(8, 3))])
    )


def held(opt: torch.optim.Optimizer) -> list[int]:
    return [id(p) for g in opt.param_groups for p in g["params"]]


def run(ip, source: str) -> None:
    ip.run_cell(source).raise_error()


@pytest.fixture
def rerun(ip):
    """The issue's notebook: freeze, then the model cell re-run (not the optimizer cell)."""
    run(ip, NOTEBOOK)
    run(ip, "%freeze model.0")
    run(ip, "model = make()")
    return ip


def test_fit_refuses_instead_of_training_nothing(rerun):
    ns = rerun.user_ns
    weights = [p.detach().clone() for p in ns["model"].parameters()]
    groups = held(ns["optimizer"])
    with pytest.raises(UsageError) as refused:
        rerun.run_line_magic("fit", "train_loader --epochs 2")
    message = str(refused.value)
    assert "'optimizer' holds none of the parameters of 'model'" in message
    assert "re-create it (optimizer = torch.optim.SGD(model.parameters()" in message
    assert "--opt NAME" in message
    assert all(torch.equal(a, b) for a, b in zip(ns["model"].parameters(), weights, strict=True))
    assert held(ns["optimizer"]) == groups
    assert not torchmagic.notebook_session().fits


def test_unfreeze_never_puts_the_new_model_into_the_old_optimizer(rerun):
    ns = rerun.user_ns
    new = {id(p) for p in ns["model"].parameters()}
    groups = [list(g["params"]) for g in ns["optimizer"].param_groups]
    with pytest.raises(UsageError, match="holds none of the parameters of 'model'"):
        rerun.run_line_magic("unfreeze", "layer3 lr=1e-4")
    assert [list(g["params"]) for g in ns["optimizer"].param_groups] == groups
    assert not new & set(held(ns["optimizer"]))


@pytest.mark.parametrize(
    "call",
    [
        lambda tm: tm.freeze("layer3"),
        lambda tm: tm.unfreeze("0"),
        lambda tm: tm.unfreeze("layer3", lr=1e-4),
        lambda tm: tm.replace_head("layer3", 5),
        lambda tm: tm.fit([(torch.randn(2, 4), torch.tensor([0, 1]))]),
        lambda tm: tm.move(),
        lambda tm: tm.estimate(),
    ],
    ids=["freeze", "unfreeze", "unfreeze-lr", "replace_head", "fit", "move", "estimate"],
)
def test_every_command_that_uses_the_optimizer_refuses(call):
    old = make()
    opt = torch.optim.SGD(old.parameters(), lr=0.5)
    ns = {"model": old, "optimizer": opt}
    tm = Session(namespace=ns)
    tm.freeze("model.0")
    ns["model"] = new = make()
    flags = [p.requires_grad for p in new.parameters()]
    groups = [list(g["params"]) for g in opt.param_groups]
    with pytest.raises(TorchMagicError, match="'optimizer' holds none of") as refused:
        call(tm)
    assert refused.value.param == "optimizer"
    assert [p.requires_grad for p in new.parameters()] == flags
    assert [list(g["params"]) for g in opt.param_groups] == groups
    assert new.layer3.out_features == 3
    assert len(tm.history()) == 1


def test_showing_commands_treat_it_as_no_optimizer():
    old = make()
    ns = {"model": old, "optimizer": torch.optim.SGD(old.parameters(), lr=0.5)}
    tm = Session(namespace=ns)
    tm.freeze("0")
    ns["model"] = make()
    assert tm.summary().groups == ()
    assert tm.memory().optimizer_state == 0
    assert tm.check().misplaced == ()


def test_recreating_the_optimizer_is_the_fix(rerun):
    run(rerun, "optimizer = torch.optim.SGD(model.parameters(), lr=0.5)")
    run(rerun, "%fit train_loader --epochs 1")
    new = {id(p) for p in rerun.user_ns["model"].parameters()}
    assert set(held(rerun.user_ns["optimizer"])) == new


def test_an_emptied_optimizer_of_a_rebound_model_is_stale():
    """Freezing everything empties the optimizer; it still belongs to the old model."""
    old = make()
    opt = torch.optim.SGD(old.parameters(), lr=0.5)
    ns = {"model": old, "optimizer": opt}
    tm = Session(namespace=ns)
    tm.freeze("model")
    assert held(opt) == []
    tm.unfreeze("layer3", lr=0.1)  # the same model object: the empty optimizer is still its
    assert "layer3" in [g.get("name") for g in opt.param_groups]
    tm.freeze("model")
    ns["model"] = make()
    with pytest.raises(TorchMagicError, match="made for the model 'model' named before"):
        tm.unfreeze("layer3", lr=0.1)
    assert held(opt) == []


def test_the_first_command_after_a_rebind_names_the_left_over_optimizer():
    """Nothing remembered yet: no optimizer is used, and fit names the left-over one."""
    old = make()
    ns = {"model": old, "optimizer": torch.optim.SGD(old.parameters(), lr=0.5)}
    ns["model"] = make()
    tm = Session(namespace=ns)
    with pytest.raises(TorchMagicError, match="'optimizer' holds the parameters of a model no"):
        tm.fit([(torch.randn(2, 4), torch.tensor([0, 1]))])


def test_a_named_optimizer_of_another_model_is_refused(resnet):
    """``--opt b`` where b trains another model would put layer4 in two optimizers."""
    other = nn.Linear(3, 3)
    a = torch.optim.SGD(resnet.parameters(), lr=0.1)
    b = torch.optim.SGD(other.parameters(), lr=0.1)
    tm = Session(namespace={"model": resnet, "other": other, "a": a, "b": b})
    tm.use("model")
    tm.freeze("layer4")
    groups_b = [list(g["params"]) for g in b.param_groups]
    with pytest.raises(TorchMagicError, match="'b' holds none of the parameters of 'model' "):
        tm.unfreeze("layer4", lr=1e-4, optimizer="b")
    with pytest.raises(TorchMagicError, match=r"\(it trains 'other'\)"):
        tm.freeze("layer3", optimizer="b")
    assert [list(g["params"]) for g in b.param_groups] == groups_b
    assert not any(p.requires_grad for p in resnet.layer4.parameters())
    layer4 = {id(p) for p in resnet.layer4.parameters()}
    assert not layer4 & set(held(a)) and not layer4 & set(held(b))


def test_named_opt_flag_in_the_magic_is_refused_too(ip):
    run(ip, NOTEBOOK)
    run(ip, "other = nn.Linear(2, 2); other_opt = torch.optim.SGD(other.parameters(), lr=0.1)")
    run(ip, "%freeze model.layer3")
    with pytest.raises(UsageError, match="'other_opt' holds none of the parameters of 'model'"):
        ip.run_line_magic("unfreeze", "model.layer3 --opt other_opt")
    assert len(ip.user_ns["other_opt"].param_groups) == 1


def test_doctor_advises_recreating_it_not_unfreezing_into_it():
    old = make()
    opt = torch.optim.SGD(old.parameters(), lr=0.5)
    ns = {"model": old, "optimizer": opt}
    Session(namespace=ns).freeze("0")
    ns["model"] = make()
    findings = diagnose(ns).findings
    stale = [f for f in findings if f.check == "stale-optimizer"]
    assert len(stale) == 1 and stale[0].severity == "error"
    assert stale[0].fix.startswith("re-create it: optimizer = torch.optim.SGD(model.parameters()")
    assert not any("unfreeze(" in f.fix for f in findings)


def test_doctor_on_two_models_in_one_optimizer():
    """What the old code left behind: the new model's parameters added to the old
    optimizer. The fix is still a new optimizer."""
    old = make()
    opt = torch.optim.SGD(old.parameters(), lr=0.5)
    new = make()
    opt.add_param_group({"params": list(new[0].parameters())})
    ns = {"model": new, "optimizer": opt}
    del old
    findings = diagnose(ns).findings
    stale = next(f for f in findings if f.check == "stale-optimizer")
    assert "two models in one optimizer" in stale.message
    unoptimized = next(f for f in findings if f.check == "unoptimized")  # layer3: in no group
    assert unoptimized.fix.startswith("re-create optimizer over model")
    assert all("unfreeze(" not in f.fix for f in findings)


def test_a_free_parameter_in_the_optimizer_is_not_stale():
    """A temperature bound to a variable (or a model inside a trainer object) is the
    user's: the optimizer holding it is not left over."""
    model = make()
    temperature = nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD([*model.parameters(), temperature], lr=0.1)
    findings = diagnose({"model": model, "temperature": temperature, "opt": opt}).findings
    assert not [f for f in findings if f.check == "stale-optimizer"]


def test_backbone_and_head_in_one_optimizer_survive_freezing_the_whole_backbone():
    """``backbone`` and ``head`` bound apart, one optimizer over both (linear probing, then
    fine-tuning): once the backbone is frozen whole, the optimizer holds only the head's
    parameters, yet it is still the backbone's (the same objects): unfreezing goes back in."""
    backbone, head = make(), nn.Linear(3, 2)
    opt = torch.optim.AdamW(
        [{"params": backbone.parameters(), "lr": 1e-4}, {"params": head.parameters()}], lr=1e-3
    )
    ns = {"backbone": backbone, "head": head, "optimizer": opt}
    tm = Session(namespace=ns)
    tm.freeze("backbone")
    assert opt.param_groups[0]["params"] == []
    tm.unfreeze("backbone.layer3", lr=5e-5)
    layer3 = [id(p) for p in backbone.layer3.parameters()]
    assert [id(p) for p in opt.param_groups[-1]["params"]] == layer3
    before = [p.detach().clone() for p in backbone.layer3.parameters()]
    head(backbone(torch.randn(4, 4))).sum().backward()
    opt.step()
    moved = zip(before, backbone.layer3.parameters(), strict=True)
    assert all(not torch.equal(b, p) for b, p in moved)
    tm.freeze("backbone.layer3")
    tm.unfreeze("backbone.layer3", optimizer="optimizer")  # named: the same answer
    assert [id(p) for p in opt.param_groups[-1]["params"]] == layer3  # home again
    # re-created for the head alone: no longer the backbone's
    tm.freeze("backbone")
    ns["optimizer"] = torch.optim.AdamW(head.parameters(), lr=1e-3)
    with pytest.raises(TorchMagicError, match="it trains 'head'"):
        tm.unfreeze("backbone.layer3", lr=5e-5)
