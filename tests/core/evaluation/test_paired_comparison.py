"""against=: two evaluations of the same samples compared pair by pair (accuracy change,
fixed / broken counts, McNemar's exact test), refused when they saw other samples."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import binomtest
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchmagic import Session
from torchmagic.core import TorchMagicError
from torchmagic.core.evaluation.compare import mcnemar_exact

N, CLASSES = 40, 4


class Lookup(nn.Module):
    """Predicts a fixed class for each sample, the sample's index being its input."""

    def __init__(self, predictions: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(nn.functional.one_hot(predictions, CLASSES).float() * 5)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.logits[index]


def _data(count: int = N, order: torch.Tensor | None = None) -> DataLoader:
    index = torch.arange(count) if order is None else order
    return DataLoader(TensorDataset(index, index % CLASSES), batch_size=16)


def test_known_fixed_and_broken_counts():
    truth = torch.arange(N) % CLASSES
    before = truth.clone()
    before[:10] = (truth[:10] + 1) % CLASSES  # 10 wrong before
    after = truth.clone()
    after[7:10] = (truth[7:10] + 1) % CLASSES  # 7 of them fixed, 3 still wrong
    after[20:22] = (truth[20:22] + 2) % CLASSES  # 2 broken
    session = Session(namespace={})
    session.workspace.namespace.update(old=Lookup(before), new=Lookup(after), val=_data())
    first = session.evaluate("val", model="old")
    second = session.evaluate("val", model="new", against=first)
    comparison = second.comparison
    assert comparison is not None and first.comparison is None
    assert (comparison.fixed, comparison.broken) == (7, 2)
    assert comparison.accuracy_change == pytest.approx((7 - 2) / N)
    assert comparison.p_value == pytest.approx(binomtest(2, 9, 0.5).pvalue)
    assert not comparison.clear
    # by the variable's name, the other way round
    session.workspace.namespace["ev"] = second
    back = session.evaluate("val", model="old", against="ev").comparison
    assert back is not None and (back.fixed, back.broken) == (2, 7)
    assert back.accuracy_change == pytest.approx(-comparison.accuracy_change)


@pytest.mark.parametrize(("fixed", "broken"), [(0, 0), (1, 0), (14, 5), (5, 14), (30, 3), (9, 9)])
def test_mcnemar_exact_is_scipys_binomial_test(fixed, broken):
    want = 1.0 if fixed + broken == 0 else binomtest(fixed, fixed + broken, 0.5).pvalue
    assert mcnemar_exact(fixed, broken) == pytest.approx(want, rel=1e-12)


def test_other_samples_are_refused_in_one_line():
    truth = torch.arange(N) % CLASSES
    model = Lookup(truth)
    session = Session(model)
    first = session.evaluate(_data())
    with pytest.raises(TorchMagicError, match="saw 40 samples and this evaluation 30") as info:
        session.evaluate(_data(30), against=first)
    assert info.value.param == "against"
    shuffled = _data(order=torch.randperm(N, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(TorchMagicError, match="saw other samples"):
        session.evaluate(shuffled, against=first)
    with pytest.raises(TorchMagicError, match="earlier evaluation, got a Tensor"):
        session.evaluate(_data(), against=truth)
