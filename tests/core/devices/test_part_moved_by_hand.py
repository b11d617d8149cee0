"""A part of the model cast or moved by hand (``model.fc.double()``, ``model.fc.to("meta")``):
``fit`` refuses in one line naming the part and what is wrong with it, changing nothing,
and the doctor reports it; float32 parts of a half-precision model are fine."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn

import torchmagic
from snapshots import assert_same, snapshot


def _net() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("body", nn.Sequential(nn.Linear(6, 8), nn.ReLU()))
    model.add_module("fc", nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    return model, opt


def _optimizer(model: nn.Module, opt: torch.optim.Optimizer) -> tuple:
    """Groups by identity, and the body's state as plain values."""
    groups = [[id(p) for p in g["params"]] for g in opt.param_groups]
    body = [opt.state[p]["momentum_buffer"].tolist() for p in model.body.parameters()]
    return groups, body


BATCHES = [(torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))]
MOVES = {
    "double": (
        lambda m: m.fc.double(),
        r"^'model\.fc' is float64 but the rest of 'model' "
        r"is float32; cast it back \(model\.fc\.to\(torch\.float32\)\)",
    ),
    "meta": (
        lambda m: m.fc.to("meta"),
        r"^'model\.fc' is on meta but the rest of 'model' "
        r"is on cpu; it holds no weights any more",
    ),
}


@pytest.mark.parametrize("how", list(MOVES))
def test_fit_refuses_in_one_line_naming_the_part_and_changes_nothing(how):
    model, opt = _net()
    move, message = MOVES[how]
    move(model)
    tm = torchmagic.Session(namespace={"model": model, "optimizer": opt})
    before = snapshot(model.body), _optimizer(model, opt)
    with pytest.raises(torchmagic.TorchMagicError, match=message) as info:
        tm.fit(BATCHES, epochs=1)
    assert "\n" not in str(info.value)
    assert_same(before[0], snapshot(model.body))  # meta tensors cannot be compared: fc by dtype
    assert _optimizer(model, opt) == before[1]
    assert {p.dtype for p in model.fc.parameters()} == {
        torch.float64 if how == "double" else torch.float32
    }
    found = [f for f in tm.doctor().findings if f.check == "part-moved-by-hand"]
    assert [(f.subject, f.severity) for f in found] == [("model.fc", "error")]
    assert ("float64" if how == "double" else "on meta") in found[0].message


def test_the_magic_says_it_as_a_usage_error(ip):
    model, opt = _net()
    model.fc.double()
    ip.user_ns.update(model=model, optimizer=opt, batches=BATCHES)
    with pytest.raises(UsageError, match=r"'model\.fc' is float64"):
        ip.run_line_magic("fit", "batches --epochs 1")
    assert model.fc.weight.dtype == torch.float64


def test_a_float32_part_of_a_half_model_and_a_whole_cast_model_are_fine():
    model, opt = _net()
    model.to(torch.bfloat16)
    model.fc.float()  # kept wider on purpose, as transformers does
    tm = torchmagic.Session(namespace={"model": model, "optimizer": opt})
    assert not [f for f in tm.doctor().findings if f.check == "part-moved-by-hand"]
    whole, whole_opt = _net()
    whole.double()
    tm = torchmagic.Session(namespace={"model": whole, "optimizer": whole_opt})
    tm.fit([(x.double(), y) for x, y in BATCHES], epochs=1)
    assert not [f for f in tm.doctor().findings if f.check == "part-moved-by-hand"]
