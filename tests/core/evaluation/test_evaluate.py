"""Session.evaluate on a trained model: metrics equal scikit-learn's, the worst samples
equal a hand ranking, the model and every random state are left bit for bit, and bad
input is one line that changes nothing."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    accuracy_score,
    classification_report,
    confusion_matrix,
    f1_score,
    top_k_accuracy_score,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchmagic import Session
from torchmagic.core import TorchMagicError
from torchmagic.core.evaluation import EvaluateOptions, Evaluation


def _hand(model: nn.Module, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, targets) of the hand-written eval loop, on a copy left in eval mode."""
    copied = copy.deepcopy(model).eval()
    logits, targets = [], []
    with torch.no_grad():
        for x, y in loader:
            logits.append(copied(x))
            targets.append(y)
    return torch.cat(logits), torch.cat(targets)


def test_metrics_equal_sklearns(digits, val_loader):
    model = digits[0]
    ev = Session(model).evaluate(val_loader, top=3)
    logits, y = _hand(model, val_loader)
    pred = logits.argmax(1)
    assert 0.5 < ev.accuracy < 1.0  # trained, and still making mistakes to count
    assert ev.samples == len(y) == 597
    assert torch.equal(ev.confusion, torch.as_tensor(confusion_matrix(y, pred, labels=range(10))))
    assert ev.confusion.dtype == torch.int64
    assert ev.accuracy == pytest.approx(accuracy_score(y, pred), abs=1e-6)
    report = classification_report(y, pred, output_dict=True, zero_division=0)
    for c, row in enumerate(ev.per_class):
        want = report[str(c)]
        assert row.label == str(c) and row.support == want["support"]
        assert row.precision == pytest.approx(want["precision"], abs=1e-6)
        assert row.recall == pytest.approx(want["recall"], abs=1e-6)
        assert row.f1 == pytest.approx(want["f1-score"], abs=1e-6)
    macro = np.mean([row.f1 for row in ev.per_class])
    assert macro == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-6)
    assert ev.loss == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert ev.top_k == 3
    top3 = top_k_accuracy_score(y, logits.softmax(1), k=3, labels=range(10))
    assert ev.top_k_accuracy == pytest.approx(top3, abs=1e-6)
    off = [(t, p, int(ev.confusion[t, p])) for t in range(10) for p in range(10) if t != p]
    biggest = max(n for _, _, n in off)
    assert ev.most_confused[0][2] == biggest
    assert (ev.most_confused[0][0], ev.most_confused[0][1]) in {
        (str(t), str(p)) for t, p, n in off if n == biggest
    }
    assert [n for *_, n in ev.most_confused] == sorted(
        (n for *_, n in ev.most_confused), reverse=True
    )
    assert torch.equal(ev.correct, pred == y)


def test_worst_is_the_hand_ranking_of_per_sample_losses(digits, val_loader):
    model = digits[0]
    ev = Session(model).evaluate(val_loader, worst=8)
    logits, y = _hand(model, val_loader)
    losses = nn.functional.cross_entropy(logits, y, reduction="none")
    order = torch.argsort(losses, descending=True, stable=True)[:8]
    assert [w.index for w in ev.worst] == order.tolist()
    for w, i in zip(ev.worst, order.tolist(), strict=True):
        assert w.loss == pytest.approx(float(losses[i]), rel=1e-5)
        assert w.target == int(y[i]) and w.predicted == int(logits[i].argmax())
        assert torch.equal(w.input, val_loader.dataset[i][0])
        assert w.path is None  # tensors: no file


def test_worst_with_a_loss_by_variable_and_a_loss_module(digits, val_loader):
    model = digits[0]
    criterion = nn.CrossEntropyLoss()
    by_module = Session(model).evaluate(val_loader, worst=4, loss=criterion)
    by_name = Session(model).evaluate(val_loader, worst=4)
    assert [w.index for w in by_module.worst] == [w.index for w in by_name.worst]
    assert criterion.reduction == "mean"  # the user's loss is not changed

    def plain(output, target):  # no reduction to ask for: one call per sample
        return nn.functional.cross_entropy(output, target)

    by_hand = Session(model, namespace={"model": model, "plain": plain}).evaluate(
        val_loader, worst=4, loss="plain"
    )
    assert [w.index for w in by_hand.worst] == [w.index for w in by_name.worst]
    assert by_hand.loss == pytest.approx(by_name.loss, rel=1e-5)


def _state(model: nn.Module) -> dict:
    return {
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "modes": [m.training for m in model.modules()],
        "flags": [p.requires_grad for p in model.parameters()],
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].copy(),
    }


def _same(before: dict, after: dict) -> None:
    assert before["weights"].keys() == after["weights"].keys()
    for key, value in before["weights"].items():
        assert torch.equal(value, after["weights"][key]), key
    assert before["modes"] == after["modes"]
    assert before["flags"] == after["flags"]
    assert torch.equal(before["torch"], after["torch"])
    assert before["python"] == after["python"]
    assert np.array_equal(before["numpy"], after["numpy"])


def test_the_model_and_every_random_state_are_left_bit_for_bit(digits):
    model = copy.deepcopy(digits[0])
    model.train()
    model[1].eval()  # a BatchNorm the user put in eval mode on purpose
    model[0].weight.requires_grad_(False)
    generator = torch.Generator().manual_seed(3)
    shuffled = DataLoader(digits[2], batch_size=64, shuffle=True, generator=generator)
    unseeded = DataLoader(digits[2], batch_size=64, shuffle=True)  # draws from torch's RNG
    before = _state(model)
    own = generator.get_state()
    session = Session(model)
    session.evaluate(shuffled, worst=5, top=2)
    session.evaluate(unseeded, worst=5)
    _same(before, _state(model))
    assert torch.equal(own, generator.get_state())
    assert model.training and not model[1].training and model[2].training


def test_a_model_left_in_train_mode_measures_as_in_eval_mode(digits, val_loader):
    model = copy.deepcopy(digits[0]).train()
    ev = Session(model).evaluate(val_loader)
    logits, y = _hand(model, val_loader)
    assert ev.accuracy == pytest.approx(float((logits.argmax(1) == y).float().mean()), abs=1e-6)
    assert ev.loss == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-5)
    same = Session(copy.deepcopy(model).eval()).evaluate(val_loader)
    assert torch.equal(ev.confusion, same.confusion) and ev.loss == same.loss
    assert model.training


def test_names_and_options_objects(digits, val_loader):
    model = digits[0]
    namespace = {"model": model, "val_loader": val_loader}
    session = Session(namespace=namespace)
    ev = session.evaluate("val_loader", options=EvaluateOptions(worst=2))
    assert isinstance(ev, Evaluation) and len(ev.worst) == 2
    assert ev.model_name == "model" and ev.data_name == "val_loader"
    assert EvaluateOptions().worst == 0 and EvaluateOptions().loss == "cross_entropy"


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1)).squeeze(1)


@pytest.mark.parametrize(
    ("given", "match", "param"),
    [
        ({"worst": -1}, "worst must be a whole number", "worst"),
        ({"top": 0}, "top must be a positive", "top"),
        ({"top": 11}, "top=11 but the model has 10 classes", "top"),
        ({"loss": "cross_entropie"}, "unknown loss 'cross_entropie'", "loss"),
        ({"against": "nothing"}, "no variable named 'nothing'", "against"),
    ],
)
def test_bad_options_are_one_line_and_change_nothing(digits, val_loader, given, match, param):
    model = copy.deepcopy(digits[0]).train()
    before = _state(model)
    with pytest.raises(TorchMagicError, match=match) as info:
        Session(model).evaluate(val_loader, **given)
    assert info.value.param == param and "\n" not in str(info.value)
    _same(before, _state(model))


def test_bad_data_is_one_line(digits):
    model = digits[0]
    x, y = digits[2].tensors
    cases = [
        (Regressor(), DataLoader(TensorDataset(x, y), batch_size=8), "outputs of shape"),
        (model, DataLoader(TensorDataset(x, y.float()), batch_size=8), "class indices"),
        (
            model,
            DataLoader(TensorDataset(x, y + 5), batch_size=8),
            "targets run from 5 to .* but the model has 10 classes",
        ),
        (model, DataLoader(TensorDataset(x[:0], y[:0]), batch_size=8), "yields no batch"),
        (model, [x, y], "must yield"),
    ]
    for module, data, match in cases:
        with pytest.raises(TorchMagicError, match=match):
            Session(module).evaluate(data)


def test_the_forward_runs_in_eval_and_inference_mode_under_the_amp_policy(digits, val_loader):
    model = copy.deepcopy(digits[0]).train()
    seen: list[tuple[bool, bool, bool]] = []

    def look(module, inputs, output):
        seen.append(
            (torch.is_autocast_enabled("cpu"), torch.is_inference_mode_enabled(), module.training)
        )

    model[0].register_forward_hook(look)
    session = Session(model)
    session.amp_on("bf16")
    ev = session.evaluate(val_loader)
    assert seen and all(
        autocast and inference and not training for autocast, inference, training in seen
    )
    assert ev.samples == 597 and model[0].training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    session.amp_off()
    seen.clear()
    session.evaluate(val_loader)
    assert seen and not any(autocast for autocast, _, _ in seen)
