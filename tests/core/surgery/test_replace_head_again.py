"""Re-running a ``%replace_head fc 5`` cell replaces a head that already has that shape:
once it has trained, the command says so (and that undo restores it)."""

from __future__ import annotations

import torch
from IPython.utils.capture import capture_output
from torch import nn

from torchmagic import Session


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def _notes(change) -> list[str]:
    return [str(n) if isinstance(n, str) else "".join(map(str, n)) for n in change.effect.notes]


def test_a_trained_head_of_the_same_shape_is_named() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tm = Session(model, opt)
    first = tm.replace_head("2", 5)
    assert not any("already" in n for n in _notes(first))  # 8→3 became 8→5
    again = tm.replace_head("2", 5)  # not trained yet: a fresh head either way
    assert not any("already" in n for n in _notes(again))
    _step(model, opt)
    trained = model[2]
    weight = trained.weight.detach().clone()
    change = tm.replace_head("2", 5)
    (note,) = [n for n in change.effect.notes if not isinstance(n, str)]
    from torchmagic.core.advice import spelled

    assert (
        spelled(note)
        == "2 was already 8→5 and trained: replaced again by a fresh one; tm.undo() restores it"
    )
    assert model[2] is not trained
    tm.undo()
    assert model[2] is trained and torch.equal(model[2].weight, weight)


def test_the_magic_says_it_with_the_undo_magic(ip) -> None:
    model = nn.Sequential()
    model.add_module("body", nn.Linear(4, 8))
    model.add_module("fc", nn.Linear(8, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ip.user_ns.update(model=model, opt=opt)
    _step(model, opt)
    with capture_output() as cap:
        ip.run_line_magic("replace_head", "fc 5")
    text = cap.outputs[0].data["text/plain"]
    assert (
        "fc was already 8→5 and trained: replaced again by a fresh one; %tm undo restores it"
        in text
    )
