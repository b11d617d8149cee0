"""A backbone optimizer and a head optimizer on one model (as CLIP and GAN codes keep
them): each command edits each parameter in the optimizer holding it, a named optimizer
chooses for one command only, and the post-condition covers both. Every case is compared
with the same edit written by hand in plain PyTorch, bit for bit, over training steps."""

from __future__ import annotations

from copy import deepcopy

import pytest
import torch
from torch import nn

from builders import named_mlp
from torchmagic import Session, TorchMagicError
from torchmagic.core.session import invariants, names

X = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))


def setup() -> dict:
    """The model, SGD with momentum over its two bodies, AdamW over its head, trained two
    steps so that both optimizers hold state."""
    model = named_mlp()
    backbone = [*model.body1.parameters(), *model.body2.parameters()]
    ns = {
        "model": model,
        "backbone_opt": torch.optim.SGD(backbone, lr=0.05, momentum=0.9),
        "head_opt": torch.optim.AdamW(model.fc.parameters(), lr=1e-2),
    }
    steps(ns, 2)
    return ns


def steps(ns: dict, n: int, y: torch.Tensor = Y) -> None:
    for _ in range(n):
        for opt in (ns["backbone_opt"], ns["head_opt"]):
            opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ns["model"](X), y).backward()
        for opt in (ns["backbone_opt"], ns["head_opt"]):
            opt.step()


def held(opt: torch.optim.Optimizer) -> list[int]:
    return [id(p) for g in opt.param_groups for p in g["params"]]


def ids(module: nn.Module) -> list[int]:
    return [id(p) for p in module.parameters()]


def leave(opt: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    """By hand: ``params`` out of ``opt``'s groups, their state dropped, frozen."""
    gone = {id(p) for p in params}
    for group in opt.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in gone]
    for p in params:
        opt.state.pop(p, None)
        p.requires_grad_(False)
        p.grad = None


def assert_same(ns: dict, hand: dict) -> None:
    """Weights, trainability, groups (by position) and every state tensor, exactly."""
    ours, theirs = ns["model"].state_dict(), hand["model"].state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    mine = dict(ns["model"].named_parameters())
    for name, p in hand["model"].named_parameters():
        assert mine[name].requires_grad == p.requires_grad, name
    for opt_name in ("backbone_opt", "head_opt"):
        a, b = ns[opt_name], hand[opt_name]
        position = {id(p): n for n, p in ns["model"].named_parameters()}
        twin = {id(p): n for n, p in hand["model"].named_parameters()}
        assert [[position[id(p)] for p in g["params"]] for g in a.param_groups] == [
            [twin[id(p)] for p in g["params"]] for g in b.param_groups
        ], opt_name
        assert [g["lr"] for g in a.param_groups] == [g["lr"] for g in b.param_groups]
        assert sorted(position[id(p)] for p in a.state) == sorted(twin[id(p)] for p in b.state)
        by_name = {twin[id(p)]: s for p, s in b.state.items()}
        for p, state in a.state.items():
            other = by_name[position[id(p)]]
            assert state.keys() == other.keys()
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(other[key])), key


def test_a_named_optimizer_does_not_stick_and_the_new_head_goes_where_the_old_was():
    ns = setup()
    hand = deepcopy(ns)
    tm = Session(namespace=ns)
    tm.freeze("body1", optimizer="backbone_opt")
    old = list(ns["model"].fc.parameters())
    change = tm.replace_head("fc", 5)
    assert change.optimizer_name == "head_opt"
    new = ns["model"].fc
    assert held(ns["head_opt"]) == ids(new)
    assert held(ns["backbone_opt"]) == ids(ns["model"].body2)
    assert not any(p in ns["head_opt"].state for p in old)

    leave(hand["backbone_opt"], list(hand["model"].body1.parameters()))
    head = nn.Linear(8, 5)
    head.load_state_dict(new.state_dict())
    for p in hand["model"].fc.parameters():
        hand["head_opt"].state.pop(p, None)
    hand["model"].fc = head
    hand["head_opt"].param_groups[0]["params"] = list(head.parameters())
    assert_same(ns, hand)
    y = Y % 5
    steps(ns, 3, y)
    steps(hand, 3, y)
    assert_same(ns, hand)


def test_a_plain_freeze_of_the_head_empties_the_head_optimizer():
    ns = setup()
    hand = deepcopy(ns)
    tm = Session(namespace=ns)
    tm.freeze("body1", optimizer="backbone_opt")
    change = tm.freeze("fc")
    assert change.optimizer_name == "head_opt"
    assert held(ns["head_opt"]) == [] and not ns["head_opt"].state
    assert held(ns["backbone_opt"]) == ids(ns["model"].body2)
    assert not tm.doctor().findings  # nothing left for the doctor to fix
    leave(hand["backbone_opt"], list(hand["model"].body1.parameters()))
    leave(hand["head_opt"], list(hand["model"].fc.parameters()))
    steps(ns, 2)
    steps(hand, 2)
    assert_same(ns, hand)

    tm.unfreeze("fc")  # back into the head optimizer's group, with fresh state
    for p in hand["model"].fc.parameters():
        p.requires_grad_(True)
    hand["head_opt"].param_groups[0]["params"] = list(hand["model"].fc.parameters())
    assert held(ns["head_opt"]) == ids(ns["model"].fc)
    steps(ns, 2)
    steps(hand, 2)
    assert_same(ns, hand)


def test_the_whole_model_leaves_both_and_each_part_comes_home_to_its_own():
    ns = setup()
    saved = {n: deepcopy(ns[n].state_dict()) for n in ("backbone_opt", "head_opt")}
    tm = Session(namespace=ns)
    change = tm.freeze("model")
    assert held(ns["backbone_opt"]) == [] and held(ns["head_opt"]) == []
    assert not ns["backbone_opt"].state and not ns["head_opt"].state
    assert change.after.trainable == 0
    tm.undo()  # both optimizers' groups and state back, bit for bit
    for n in ("backbone_opt", "head_opt"):
        now = ns[n].state_dict()
        assert now["param_groups"] == saved[n]["param_groups"]
        for key, state in saved[n]["state"].items():
            for k, v in state.items():
                assert torch.equal(torch.as_tensor(now["state"][key][k]), torch.as_tensor(v))

    hand = deepcopy(ns)
    tm.freeze("model")
    tm.unfreeze("body2", "fc", lr=1e-3)  # a new group in each part's own optimizer
    assert [g.get("name") for g in ns["backbone_opt"].param_groups] == [None, "body2"]
    assert [g.get("name") for g in ns["head_opt"].param_groups] == [None, "fc"]
    for opt in ("backbone_opt", "head_opt"):
        leave(hand[opt], list(hand["model"].parameters()))
    for opt, part in (("backbone_opt", "body2"), ("head_opt", "fc")):
        params = list(getattr(hand["model"], part).parameters())
        for p in params:
            p.requires_grad_(True)
        template = {k: v for k, v in hand[opt].param_groups[0].items() if k != "params"}
        hand[opt].add_param_group({**template, "params": params, "lr": 1e-3, "name": part})
    assert_same(ns, hand)
    steps(ns, 2)
    steps(hand, 2)
    assert_same(ns, hand)


def test_a_named_optimizer_may_not_take_what_another_trains():
    ns = setup()
    before = {n: (held(ns[n]), deepcopy(ns[n].state_dict())) for n in ("backbone_opt", "head_opt")}
    weights = deepcopy(ns["model"].state_dict())
    tm = Session(namespace=ns)
    with pytest.raises(TorchMagicError) as refused:
        tm.unfreeze("fc", lr=1e-3, optimizer="backbone_opt")
    assert "\n" not in str(refused.value)
    assert "fc.weight is trained by 'head_opt'" in str(refused.value)
    for n, (groups, state) in before.items():
        assert held(ns[n]) == groups
        now = ns[n].state_dict()
        assert now["param_groups"] == state["param_groups"]
        for key, entry in state["state"].items():
            for k, v in entry.items():
                assert torch.equal(torch.as_tensor(now["state"][key][k]), torch.as_tensor(v))
    for key, value in ns["model"].state_dict().items():
        assert torch.equal(value, weights[key]), key
    assert all(p.requires_grad for p in ns["model"].parameters())


def test_the_post_condition_sees_every_optimizer_holding_the_model():
    """A frozen head left in the head optimizer is seen although the command's optimizer
    is the backbone's."""
    ns = setup()
    tm = Session(namespace=ns)
    target = names.bound(tm.workspace, "model", "backbone_opt", False)
    assert [o.name for o in target.others] == ["head_opt"]
    ns["model"].fc.weight.requires_grad_(False)
    problems = invariants.observe(target).problems.values()
    assert "parameter fc.weight is frozen but still in a param group of 'head_opt'" in problems


def test_the_magics_route_each_command_to_the_part_s_optimizer(ip):
    ns = setup()
    ip.user_ns.update(ns)
    ip.run_line_magic("freeze", "model.body1 --opt backbone_opt")
    ip.run_line_magic("replace_head", "model.fc 5")
    assert held(ns["head_opt"]) == ids(ip.user_ns["model"].fc)
    assert held(ns["backbone_opt"]) == ids(ns["model"].body2)
    ip.run_line_magic("freeze", "model.fc")
    assert held(ns["head_opt"]) == []
    ip.run_line_magic("unfreeze", "model.fc model.body1 lr=1e-3")
    assert [g.get("name") for g in ns["head_opt"].param_groups] == [None, "fc"]
    assert [g.get("name") for g in ns["backbone_opt"].param_groups] == [None, "body1"]


def test_a_named_optimizer_is_found_again_by_what_left_it():
    """Named once (it also trains another module), not remembered: the parameters that
    left it frozen find it again, named or not."""
    model, other = named_mlp(), nn.Linear(2, 2)
    opt = torch.optim.SGD([*model.parameters(), *other.parameters()], lr=0.1)
    tm = Session(namespace={"model": model, "other": other, "opt": opt})
    tm.use("model")
    tm.freeze("model", optimizer="opt")
    assert held(opt) == ids(other) and tm.workspace.optimizer_of == {}
    assert tm.unfreeze("body1", optimizer="opt").optimizer_name == "opt"
    assert tm.unfreeze("model").optimizer_name == "opt"
    assert sorted(held(opt)) == sorted(ids(model) + ids(other))


def test_fit_asks_which_optimizer_while_both_hold_trainable_parameters():
    """A command that routed to one optimizer does not make it the one %fit steps: the
    other's parameters would get gradients and never change."""
    ns = setup()
    ns["train"] = [(X, Y)]
    tm = Session(namespace=ns)
    tm.freeze("body1")
    weights = deepcopy(ns["model"].state_dict())
    with pytest.raises(TorchMagicError, match="several optimizers hold 'model'") as refused:
        tm.fit("train", epochs=1)
    assert "\n" not in str(refused.value)
    for key, value in ns["model"].state_dict().items():
        assert torch.equal(value, weights[key]), key
    tm.freeze("fc")  # the head optimizer holds nothing now: the backbone's is the one
    assert len(tm.fit("train", epochs=1).epochs) == 1
