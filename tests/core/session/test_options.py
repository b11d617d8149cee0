"""A command's settings come as keywords or as one options object, never both; the replay
record is derived from the options either way."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from torchmagic import Session, TorchMagicError
from torchmagic.core import FitOptions, FreezeOptions, UnfreezeOptions


def _session() -> tuple[Session, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Session(namespace={"model": model, "opt": opt}), model


def test_an_options_object_does_what_the_keywords_do() -> None:
    by_keywords, a = _session()
    by_options, b = _session()
    one = by_keywords.freeze("0-1", exclude=["1"], bn="train")
    two = by_options.freeze("0-1", options=FreezeOptions(exclude=("1",), bn="train"))
    assert [p.requires_grad for p in a.parameters()] == [p.requires_grad for p in b.parameters()]
    assert one.command == two.command
    (first,), (second,) = by_keywords.history(), by_options.history()
    assert first.command == second.command


def test_keywords_and_options_together_are_refused_and_change_nothing() -> None:
    tm, model = _session()
    tm.freeze()
    with pytest.raises(TorchMagicError, match="not both") as raised:
        tm.unfreeze("2", lr=1e-3, options=UnfreezeOptions(lr=1e-2))
    assert raised.value.param == "options"
    assert not any(p.requires_grad for p in model.parameters())
    assert len(tm.history()) == 1


def test_each_default_is_the_options_default() -> None:
    """The Session's keyword defaults are read from the options classes."""
    fit = inspect.signature(Session.fit).parameters
    assert fit["lr_ratio"].default == FitOptions().lr_ratio
    assert fit["epochs"].default == FitOptions().epochs
    unfreeze = inspect.signature(Session.unfreeze).parameters
    assert unfreeze["lr"].default is UnfreezeOptions().lr
