"""The one registry of what torchmagic remembers about the user's objects: it lists what
it holds, and keeps none of those objects alive."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from torchmagic import Session
from torchmagic.core.registry import REGISTRY, Registry
from torchmagic.core.surgery import lora

timm_scheduler = pytest.importorskip("timm.scheduler")


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 8),
        nn.Linear(8, 3),
    )


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    return [(torch.randn(2, 3, 8, 8), torch.tensor([0, 2])) for _ in range(2)]


def _used() -> tuple[Session, nn.Module, torch.optim.Optimizer, object]:
    """A session whose commands wrote every map: a history, home groups, a BatchNorm
    swapped for a FrozenBatchNorm2d, a timm scheduler's clock."""
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = timm_scheduler.CosineLRScheduler(opt, t_initial=4, t_in_epochs=False)
    tm = Session(model, opt, schedulers=[sched])
    tm.freeze("0-1", bn="frozen")
    tm.fit(_batches(), epochs=1)
    return tm, model, opt, sched


def test_each_map_holds_the_objects_a_command_told_it_about():
    tm, model, opt, sched = _used()
    frozen_bn = model[1]
    assert type(frozen_bn).__name__ == "FrozenBatchNorm2d"
    assert REGISTRY.histories[model]() is tm._history
    assert [r.index for r in REGISTRY.commands[model]] == [1]  # the freeze, without undo log
    assert REGISTRY.commands[model][0].tx is None
    assert opt in REGISTRY.homes
    assert frozen_bn in REGISTRY.batchnorm_originals
    assert REGISTRY.timm_clocks[sched] == 2  # two updates stepped by the fit
    held = REGISTRY.held()
    assert set(held) == {"histories", "commands", "homes", "batchnorm_originals", "timm_clocks"}
    assert all(n >= 1 for n in held.values())


def test_it_says_what_it_holds_and_what_each_map_is():
    _used()
    text = REGISTRY.describe()
    lines = text.splitlines()
    assert [line.split(" (")[0] for line in lines] == list(REGISTRY.held())
    assert all("; written by " in line and "; freed " in line for line in lines)
    assert lines[0].startswith("histories (") and "model -> the undo history" in lines[0]
    assert repr(REGISTRY).startswith("Registry(histories=")
    assert repr(Registry()) == (
        "Registry(histories=0, commands=0, homes=0, batchnorm_originals=0, timm_clocks=0)"
    )


def test_it_keeps_no_model_optimizer_scheduler_or_history_alive():
    gc.collect()  # what earlier tests left: gone before counting
    tm, model, opt, sched = _used()
    refs = [weakref.ref(o) for o in (model, model[1], opt, sched, tm._history)]
    before = REGISTRY.held()
    del tm, model, opt, sched
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    after = REGISTRY.held()
    assert all(after[name] == before[name] - 1 for name in before)


def test_a_lora_layer_carries_its_base_flags_itself_and_merge_removes_them():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    tm = Session(model, opt)
    tm.lora("0", r=2)
    layer = model[0]
    assert getattr(layer, lora.BASE_FLAGS) == (True, False)
    assert not any(lora.BASE_FLAGS in key for key in model.state_dict())
    tm.merge_lora()
    assert not hasattr(layer, lora.BASE_FLAGS)
    assert model[0].weight.requires_grad and not model[0].bias.requires_grad
    tm.undo()  # the merge undone: the layer is back, and so are its flags
    assert model[0] is layer and getattr(layer, lora.BASE_FLAGS) == (True, False)
