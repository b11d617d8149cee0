"""core.tensors: bytes (each tensor once), nested walks, optimizer state and its owners."""

from __future__ import annotations

import torch
from torch import nn

from torchmagic.core import tensors


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight  # one Parameter, two places


def stepped_adamw(model: nn.Module) -> torch.optim.AdamW:
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return opt


def test_nbytes_and_lazy_parameters():
    assert tensors.nbytes(torch.zeros(3, 4)) == 48
    assert tensors.nbytes(torch.zeros(3, dtype=torch.float16)) == 6
    assert tensors.nbytes(nn.LazyLinear(3).weight) == 0


def test_total_bytes_counts_a_tied_weight_once():
    model = Tied()
    twice = [model.embed.weight, model.out.weight]
    assert twice[0] is twice[1]
    assert tensors.total_bytes(twice) == 10 * 4 * 4
    assert list(tensors.unique(twice)) == [model.embed.weight]
    equal_but_distinct = [torch.zeros(2), torch.zeros(2)]
    assert tensors.total_bytes(equal_but_distinct) == 16


def test_leaves_walks_lists_tuples_and_dicts_to_a_depth():
    a, b, c = torch.zeros(1), torch.ones(2), torch.zeros(3)
    value = [a, (b, "text"), {"deep": [c]}]
    assert [id(t) for t in tensors.leaves(value)] == [id(a), id(b), id(c)]
    assert [id(t) for t in tensors.leaves(value, depth=2)] == [id(a), id(b)]
    assert list(tensors.leaves(value, depth=0)) == []
    assert list(tensors.leaves(a, depth=0)) == [a]


def test_leaves_skips_long_containers_or_keeps_their_newest():
    many = [torch.full((1,), float(i)) for i in range(5)]
    assert list(tensors.leaves(many, max_items=3)) == []
    newest = list(tensors.leaves(many, max_items=3, newest=True))
    assert [int(t) for t in newest] == [2, 3, 4]


def test_leaves_of_any_kind_one_level_deep():
    inner = [1, 2]
    assert list(tensors.leaves({"x": inner, "y": 3}, depth=1, kind=object)) == [inner, 3]
    assert list(tensors.leaves("alone", depth=1, kind=object)) == ["alone"]


def test_named_leaves_say_where_each_was_found():
    t, u = torch.zeros(1), torch.zeros(2)
    found = dict(tensors.named_leaves({"a": [t], "b": (1, u)}, "x"))
    assert found == {"x['a'][0]": t, "x['b'][1]": u}


def test_attribute_tensors_skip_registered_ones_and_submodules():
    model = nn.Sequential(nn.Linear(2, 2))
    model[0].anchors = torch.zeros(3)
    model[0].scales = [torch.ones(1), torch.ones(2)]
    model[0].alias = model[0].weight  # a registered tensor under another name
    model.child_ref = model[0]  # a module: walked as a module, not as an attribute
    found = dict(tensors.attribute_tensors(model, depth=3, max_items=10))
    assert set(found) == {"0.anchors", "0.scales[0]", "0.scales[1]"}
    assert found["0.anchors"] is model[0].anchors


def test_step_stays_on_the_host_unless_capturable_or_fused():
    assert tensors.step_stays_on_host({}, "step")
    assert not tensors.step_stays_on_host({"capturable": True}, "step")
    assert not tensors.step_stays_on_host({"fused": True}, "step")
    assert not tensors.step_stays_on_host({}, "exp_avg")


def test_state_entries_name_param_group_and_placement():
    model = nn.Linear(4, 3)
    opt = stepped_adamw(model)
    entries = list(tensors.state_entries(opt))
    assert {(e.param_index, e.key) for e in entries} == {
        (i, k) for i in (0, 1) for k in ("step", "exp_avg", "exp_avg_sq")
    }
    assert all(e.param is opt.param_groups[0]["params"][e.param_index] for e in entries)
    assert all(e.value is opt.state[e.param][e.key] for e in entries)
    assert not any(e.misplaced for e in entries)
    opt.state[model.weight]["exp_avg"] = torch.empty(3, 4, device="meta")
    opt.state[model.weight]["step"] = torch.tensor(1.0, device="meta")  # host-side: fine
    misplaced = [(e.param, e.key) for e in tensors.state_entries(opt) if e.misplaced]
    assert misplaced == [(model.weight, "exp_avg")]


def test_state_entries_never_create_state():
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters())
    assert list(tensors.state_entries(opt)) == []
    assert len(opt.state) == 0  # a defaultdict read with .get


def test_state_bytes_of_some_parameters_and_of_removed_ones():
    model = nn.Linear(4, 3)
    opt = stepped_adamw(model)
    weight_state = 2 * 12 * 4 + 4  # exp_avg, exp_avg_sq, float32 step
    assert tensors.state_bytes(opt, [model.weight]) == weight_state
    assert tensors.state_bytes(opt) == weight_state + 2 * 3 * 4 + 4
    opt.param_groups[0]["params"] = [model.bias]  # state outlives group membership
    assert tensors.state_bytes(opt) == weight_state + 2 * 3 * 4 + 4
    assert len(list(tensors.state_entries(opt))) == 3


def test_owners_are_the_optimizers_holding_any_of_the_parameters():
    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    head_only = torch.optim.SGD([model.bias], lr=0.1)
    elsewhere = torch.optim.SGD(other.parameters(), lr=0.1)
    found = tensors.owners([("a", head_only), ("b", elsewhere)], model.parameters())
    assert len(found) == 1 and found[0][1] is head_only
    assert list(tensors.optimizer_params(elsewhere)) == list(other.parameters())
    assert tensors.held_ids([head_only, elsewhere]) == {
        id(model.bias),
        *(id(p) for p in other.parameters()),
    }
