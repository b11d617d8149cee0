"""The engine speaks Python (``param=``), the magics layer speaks flags: the mapping from
one to the other, read from each magic's parser and key options."""

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.magics.base import explain, flags, parse, speak_flag
from torchmagic.magics.devices import DeviceMagics
from torchmagic.magics.extension import TOPICS
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


def test_explain_names_the_flag_and_appends_no_usage():
    error = TorchMagicError("max_steps must be at least 1, got 0", param="max_steps")
    assert explain(error, TrainingMagics.fit) == "--max-steps must be at least 1, got 0"
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


def _long_options():
    """(magic, option, its abbreviation) for every long option of every magic's parser;
    the abbreviation is the option less its last letter, when that is not an option."""
    for topic in TOPICS:
        for method in vars(topic).values():
            parser = getattr(method, "parser", None)
            if parser is None:
                continue
            options = [o for a in parser._actions for o in a.option_strings]
            for option in options:
                if option.startswith("--") and option[:-1] not in options:
                    yield pytest.param(method, option, option[:-1], id=option[:-1])


@pytest.mark.parametrize("method, option, abbreviation", list(_long_options()))
def test_an_abbreviated_option_is_refused_with_the_whole_name(method, option, abbreviation):
    positionals = [a for a in method.parser._actions if not a.option_strings]
    words = " ".join("x" for a in positionals if a.nargs in (None, "+"))
    with pytest.raises(UsageError) as refused:
        parse(method, f"{words} {abbreviation} 1")
    message = str(refused.value)
    assert message.startswith(f"unknown option {abbreviation}; did you mean ")
    assert option in message.partition("did you mean ")[2] and "\n" not in message


def test_fit_with_an_abbreviated_epochs_trains_nothing(ip):
    ip.run_cell(
        "import torch\nfrom torch import nn\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "torch.manual_seed(0)\n"
        "train = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,))))\n"
        "model = nn.Linear(4, 3)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    ).raise_error()
    model, opt = ip.user_ns["model"], ip.user_ns["optimizer"]
    before = snapshot(model, opt)
    with pytest.raises(UsageError, match=r"^unknown option --epoch; did you mean --epochs\?"):
        ip.run_line_magic("fit", "train --epoch 2")
    assert_same(before, snapshot(model, opt))
    assert not opt.state
