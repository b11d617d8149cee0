import pytest
import torch
import torchvision
from torch import nn

from torchmagic import Session, TorchMagicError


def make_ns(**values):
    return Session(namespace=dict(values))


def test_only_model_is_current(resnet):
    tm = make_ns(model=resnet, head=resnet.fc)  # `head` is part of `model`: not a candidate
    tm.freeze("layer1")
    assert not any(p.requires_grad for p in resnet.layer1.parameters())


def test_ambiguity_lists_candidates(resnet):
    other = nn.Sequential(nn.Linear(2, 2))
    tm = make_ns(model=resnet, other=other)
    with pytest.raises(TorchMagicError, match="candidates: model, other"):
        tm.freeze("layer1")
    tm.freeze("model.layer1")  # naming the root works, and makes it current
    tm.freeze("layer2")
    assert not any(p.requires_grad for p in resnet.layer2.parameters())


def test_failed_command_does_not_change_current(resnet):
    other = nn.Sequential(nn.Linear(2, 2))
    tm = make_ns(model=resnet, other=other)
    tm.use("model")
    with pytest.raises(TorchMagicError):
        tm.freeze("other.nope")
    assert tm.workspace.current == "model"


def test_rebinding_the_variable_is_picked_up(resnet):
    ns = {"model": resnet}
    tm = Session(namespace=ns)
    tm.freeze("layer1")
    fresh = torchvision.models.resnet18(weights=None)
    ns["model"] = fresh
    tm.freeze("layer2")
    assert all(p.requires_grad for p in fresh.layer1.parameters())  # stale object untouched
    assert not any(p.requires_grad for p in fresh.layer2.parameters())
    entries = tm.history()
    assert [e.live for e in entries] == [False, True]
    tm.undo()  # undoes layer2 on the fresh model
    with pytest.raises(
        TorchMagicError,
        match=r"nothing to undo: tm\.freeze\(\"layer1\"\) changed the model 'model' named "
        r"before it was re-bound \(its cell re-run\), not the one it names now",
    ):
        tm.undo()  # the stale entry is never replayed on the new object


def test_no_model_anywhere():
    with pytest.raises(TorchMagicError, match="no model found"):
        make_ns(x=1).freeze("layer1")


def test_not_a_module_root():
    tm = make_ns(model=nn.Linear(2, 2), config=3)
    with pytest.raises(TorchMagicError, match="'config' is a int"):
        tm.use("config")


def test_optimizer_found_by_identity_and_remembered(resnet):
    decoy = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    opt = torch.optim.SGD(resnet.parameters(), lr=0.1)
    ns = {"model": resnet, "decoy": decoy, "optimizer": opt}
    tm = Session(namespace=ns)
    change = tm.freeze("model")  # empties the optimizer's only group
    assert change.optimizer_name == "optimizer"
    change = tm.unfreeze("fc", lr=0.01)  # still found: remembered for this model
    assert change.optimizer_name == "optimizer"
    assert any(g.get("name") == "fc" for g in opt.param_groups)


def held(opt: torch.optim.Optimizer) -> set[int]:
    return {id(p) for g in opt.param_groups for p in g["params"]}


def test_two_optimizers_each_parameter_in_those_holding_it(resnet):
    """``a`` trains the whole model and ``b`` the head again: each command edits each
    parameter in the optimizers holding it, with no optimizer named."""
    a = torch.optim.SGD(resnet.parameters(), lr=0.1)
    b = torch.optim.Adam(resnet.fc.parameters(), lr=0.1)
    tm = make_ns(model=resnet, a=a, b=b)
    assert tm.freeze("layer1").optimizer_name == "a"
    layer1 = {id(p) for p in resnet.layer1.parameters()}
    assert not layer1 & held(a)
    tm.freeze("fc")
    fc = [id(p) for p in resnet.fc.parameters()]
    assert not set(fc) & held(a) | held(b)
    tm.unfreeze("fc")  # home again, in one of them (it was in two)
    assert (held(a) | held(b)) & set(fc) == set(fc)
    assert not held(a) & held(b)
    assert tm.freeze("layer2", optimizer="b").optimizer_name == "b"
    assert not {id(p) for p in resnet.layer2.parameters()} & held(a)


def test_schedulers_found_inside_containers(resnet):
    opt = torch.optim.SGD(resnet.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    tm = make_ns(model=resnet, optimizer=opt, scheds={"main": sched})
    tm.freeze("layer4")
    tm.unfreeze("layer4", lr=0.01)
    assert len(sched.base_lrs) == len(opt.param_groups)


def test_compiled_and_wrapped_models(resnet):
    compiled = torch.compile(resnet)
    tm = make_ns(model=compiled)
    tm.freeze("layer1")
    assert not any(p.requires_grad for p in resnet.layer1.parameters())
    dp = nn.DataParallel(torchvision.models.resnet18(weights=None))
    tm = make_ns(model=dp)
    tm.replace_head("auto", 3)
    assert dp.module.fc.out_features == 3
