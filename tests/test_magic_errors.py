"""The engine speaks Python (``param=``), the magics layer speaks flags: the mapping from
one to the other, read from each magic's parser and key options."""

import pytest
import torch
from torch import nn

from torchmagic import Session, TorchMagicError
from torchmagic.magics.base import explain, flags, speak_flag
from torchmagic.magics.devices import DeviceMagics
from torchmagic.magics.surgery import SurgeryMagics
from torchmagic.magics.training import TrainingMagics


def test_flags_come_from_the_parser_and_key_options():
    assert flags(SurgeryMagics.freeze) == {
        "exclude": "--except",
        "bn": "--bn",
        "optimizer": "--opt",
        "dry_run": "--dry-run",
    }
    assert flags(SurgeryMagics.unfreeze)["lr"] == "lr=" and flags(SurgeryMagics.unfreeze)["wd"]
    assert flags(TrainingMagics.fit)["max_steps"] == "--max-steps"
    assert flags(DeviceMagics.gpumem)["optimizer_class"] == "--optimizer"


@pytest.mark.parametrize(
    "message, param, flag, said",
    [
        (
            "epochs must be at least 1, got 0",
            "epochs",
            "--epochs",
            "--epochs must be at least 1, got 0",
        ),
        ("optimizer=nope: no variable", "optimizer", "--opt", "--opt nope: no variable"),
        (
            "hold a, b; name one with optimizer=NAME",
            "optimizer",
            "--opt",
            "hold a, b; name one with --opt NAME",
        ),
        ("unknown loss 'x'", "loss", "--loss", "--loss: unknown loss 'x'"),
        ("bad value lr=-1: must be > 0", "lr", "lr=", "bad value lr=-1: must be > 0"),
        ("epochs_total is wrong", "epochs", "--epochs", "--epochs: epochs_total is wrong"),
        ("--dropout must be < 1", "dropout", "--dropout", "--dropout must be < 1"),
    ],
)
def test_speak_flag(message, param, flag, said):
    assert speak_flag(message, param, flag) == said


def test_explain_adds_the_usage_line_only_for_an_argument():
    error = TorchMagicError("max_steps must be at least 1, got 0", param="max_steps")
    text = explain(error, TrainingMagics.fit)
    assert text.startswith("--max-steps must be at least 1, got 0; usage: %fit [MODEL]")
    assert explain(TorchMagicError("nothing to undo"), TrainingMagics.fit) == "nothing to undo"


def _small():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize(
    "call, param",
    [
        (lambda tm: tm.fit([], epochs=0), "epochs"),
        (lambda tm: tm.fit([], max_steps=0), "max_steps"),
        (lambda tm: tm.freeze("0", bn="bogus"), "bn"),
        (lambda tm: tm.freeze("0", optimizer="nope"), "optimizer"),
        (lambda tm: tm.unfreeze("0", lr=-1.0), "lr"),
        (lambda tm: tm.unfreeze("0", lr="1e-4"), "lr"),  # typed values only: no parsing here
        (lambda tm: tm.unfreeze("0", wd="0.1"), "wd"),
        (lambda tm: tm.unfreeze("0", lr=(1e-4, 1e-3, 1e-2)), "lr"),
        (lambda tm: tm.replace_head("auto", 0), "num_classes"),
        (lambda tm: tm.summary(depth=-1), "depth"),
        (lambda tm: tm.pinbench("nope"), "loader"),
    ],
)
def test_session_refusals_name_the_python_parameter(call, param):
    model, opt = _small()
    tm = Session(model, opt)
    with pytest.raises(TorchMagicError) as info:
        call(tm)
    assert info.value.param == param
    assert "--" not in str(info.value) and "%" not in str(info.value)


def test_replace_head_needs_the_class_count():
    model, opt = _small()
    with pytest.raises(TorchMagicError, match="class count is missing") as refused:
        Session(model, opt).replace_head("auto")
    assert refused.value.param == "num_classes"
