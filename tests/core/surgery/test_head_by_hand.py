"""A head assigned by hand (``model.fc = nn.Linear(…)``): the doctor says
what happened (the old head still in the optimizer, the new one in none) and offers the
fix that keeps the optimizer's state, ``%unfreeze model.fc``, which puts the new head in
the old head's groups exactly as the same edit written by hand does."""

from __future__ import annotations

import copy

import torch
import torchvision
from torch import nn

from torchmagic import Session
from torchmagic.core.advice import spelled
from torchmagic.magics.spelling import magic_line


def _trained_pair():
    """Two identical resnet18s with AdamW (backbone and head groups) after one step."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=4)
    twin = copy.deepcopy(model)
    opts = []
    for m in (model, twin):
        backbone = [p for n, p in m.named_parameters() if not n.startswith("fc.")]
        opt = torch.optim.AdamW(
            [{"params": backbone, "lr": 1e-4}, {"params": list(m.fc.parameters()), "lr": 1e-3}]
        )
        m(torch.ones(2, 3, 32, 32)).sum().backward()
        opt.step()
        opts.append(opt)
    head = nn.Linear(512, 3)
    model.fc, twin.fc = head, copy.deepcopy(head)
    return model, opts[0], twin, opts[1]


def _by_hand(model: nn.Module, opt: torch.optim.Optimizer, old: list[nn.Parameter]) -> None:
    """The fix in plain PyTorch: the old head's tensors and their state leave its group,
    the new head's join it in their place."""
    group = opt.param_groups[1]
    group["params"] = [p for p in group["params"] if all(p is not o for o in old)]
    group["params"] += list(model.fc.parameters())
    for p in old:
        del opt.state[p]


def _names(model: nn.Module, opt: torch.optim.Optimizer) -> list[list[str]]:
    name = {id(p): n for n, p in model.named_parameters()}
    return [[name.get(id(p), "?") for p in g["params"]] for g in opt.param_groups]


def test_the_doctor_names_the_head_swapped_by_hand_and_its_fix():
    model, opt, _, _ = _trained_pair()
    tm = Session(namespace={"model": model, "opt": opt})
    findings = tm.doctor().findings
    assert [f.check for f in findings] == ["head-replaced-by-hand"]
    (found,) = findings
    assert found.message == (
        "model.fc was replaced by assignment: opt still holds the old module's 2 tensor(s), "
        "and the new one's are in no param group (they get gradients but never change)"
    )
    assert spelled(found.advice, magic_line) == (
        "%unfreeze model.fc puts the new one in the old one's param groups; the old tensors "
        "leave with their state, the rest of opt's state stays"
    )


def test_the_fix_gives_the_hand_made_twin_bit_for_bit():
    model, opt, twin, twin_opt = _trained_pair()
    old = list(twin_opt.param_groups[1]["params"])
    tm = Session(namespace={"model": model, "opt": opt})
    tm.unfreeze("model.fc")
    _by_hand(twin, twin_opt, old)
    assert _names(model, opt) == _names(twin, twin_opt)
    assert [len(g["params"]) for g in opt.param_groups] == [60, 2]
    for g, h in zip(opt.param_groups, twin_opt.param_groups, strict=True):
        assert {k: v for k, v in g.items() if k != "params"} == {
            k: v for k, v in h.items() if k != "params"
        }
    pairs = list(zip(model.parameters(), twin.parameters(), strict=True))
    assert len(opt.state) == len(twin_opt.state)
    for p, q in pairs:
        assert (p in opt.state) == (q in twin_opt.state)
        for key, value in opt.state.get(p, {}).items():
            assert torch.equal(value, twin_opt.state[q][key])
    for m, o in ((model, opt), (twin, twin_opt)):  # and both train the same way
        o.zero_grad()
        m(torch.ones(2, 3, 32, 32)).sum().backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in pairs)
    assert not tm.doctor().findings


def test_undo_puts_the_old_head_back_in_the_optimizer_with_its_state():
    model, opt, _, _ = _trained_pair()
    old = list(opt.param_groups[1]["params"])
    state = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in old}
    tm = Session(namespace={"model": model, "opt": opt})
    tm.unfreeze("model.fc")
    tm.undo()
    assert [id(p) for p in opt.param_groups[1]["params"]] == [id(p) for p in old]
    for p in old:
        assert all(torch.equal(v, state[id(p)][k]) for k, v in opt.state[p].items())
