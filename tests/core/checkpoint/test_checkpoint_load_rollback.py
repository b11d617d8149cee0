"""A load's weights backed up: each tensor gets new memory the load fills, and a failed
load gives it its old memory back (a pointer swap, the same Parameter objects), also when
it fails half way through the swap; tensors that cannot be swapped so are copied."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchmagic
from snapshots import assert_same, snapshot
from test_checkpoint import build_net, surgery
from torchmagic.core.checkpoint import weights_backup


@pytest.fixture
def saved(tmp_path):
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    surgery(tm, model, opt, sched)
    path = tmp_path / "run.pt"
    tm.save(path)
    return path, model


def _memory(model: nn.Module) -> list[tuple[str, int, int]]:
    """Each tensor of the state_dict: its name, the object and where its memory is."""
    return [(k, id(v), v.data_ptr()) for k, v in model.state_dict(keep_vars=True).items()]


def _interrupt_at(monkeypatch, calls: int) -> None:
    """``torch.empty_like`` in the backup raises KeyboardInterrupt at its ``calls``-th
    call (half of the tensors given new memory)."""
    original, count = torch.empty_like, [0]

    def empty_like(*args, **kwargs):
        count[0] += 1
        if count[0] == calls:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(weights_backup.torch, "empty_like", empty_like)


def test_the_put_back_gives_each_parameter_its_old_memory():
    model = build_net()[0]
    before, memory = snapshot(model), _memory(model)
    put_back = weights_backup.back_up_weights(model)
    moved = _memory(model)
    assert all(m[1] == b[1] and m[2] != b[2] for m, b in zip(moved, memory, strict=True))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(3.0)
    put_back()
    assert _memory(model) == memory
    assert_same(before, snapshot(model))


def test_an_interrupt_half_way_through_the_swap_puts_every_tensor_back(monkeypatch):
    model = build_net()[0]
    before, memory = snapshot(model), _memory(model)
    _interrupt_at(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        weights_backup.back_up_weights(model)
    assert _memory(model) == memory
    assert_same(before, snapshot(model))


def test_an_interrupted_swap_during_a_resume_leaves_the_state_and_a_retry_works(saved, monkeypatch):
    path, trained = saved
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    before, memory = snapshot(model, opt), _memory(model)
    _interrupt_at(monkeypatch, 7)
    with pytest.raises(KeyboardInterrupt) as info:
        tm.load(path)
    monkeypatch.undo()
    assert any(entry.name == "back_up_weights" for entry in info.traceback)  # in the swap
    assert_same(before, snapshot(model, opt))
    assert _memory(model) == memory and tm.history() == ()
    tm.load(path)  # the retry
    for (key, a), b in zip(trained.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), key


class _SharedBuffer(nn.Module):
    """A buffer that is a view of the weight's memory: a swap would part them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3))
        self.register_buffer("first_row", self.weight.detach()[0])


class _OwnLoader(nn.Linear):
    """A module with its own loader, which may write a part of a tensor."""

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)


@pytest.mark.parametrize("module", [_SharedBuffer, lambda: _OwnLoader(3, 2)], ids=["view", "own"])
def test_tensors_that_cannot_be_swapped_are_copied_and_loaded_back(module):
    model = nn.Sequential(module(), nn.Linear(3, 3))
    before, memory = snapshot(model), _memory(model)
    put_back = weights_backup.back_up_weights(model)
    assert _memory(model) == memory  # nothing moved: the load writes in place
    with torch.no_grad():
        model[0].weight.fill_(3.0)
        model[1].bias.fill_(3.0)
    put_back()
    assert _memory(model) == memory
    assert_same(before, snapshot(model))
