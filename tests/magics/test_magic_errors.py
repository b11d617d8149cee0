"""The engine speaks Python (``param=``), the magics layer speaks flags: the one table from
one to the other, read from each magic's declarations and key options."""

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.core.advice import Call, Option
from torchmagic.magics.base import explain, parse
from torchmagic.magics.extension import TOPICS
from torchmagic.magics.training import TrainingMagics
from torchmagic.magics.usage import FLAGS, usage_of


def test_flags_come_from_the_declarations_and_key_options():
    assert FLAGS["freeze"] == {
        "exclude": "--except",
        "bn": "--bn",
        "optimizer": "--opt",
        "dry_run": "--dry-run",
    }
    assert FLAGS["unfreeze"]["lr"] == "lr=" and FLAGS["unfreeze"]["wd"] == "wd="
    assert FLAGS["fit"]["max_steps"] == "--max-steps" and FLAGS["fit"]["accumulate"] == "--accum"
    assert FLAGS["gpumem"]["optimizer_class"] == "--optimizer"
    assert FLAGS["summary"]["input_shape"] == "--input-shape"  # the longest of its spellings


@pytest.mark.parametrize(
    "message, param, said",
    [
        ("epochs must be at least 1, got 0", "epochs", "--epochs must be at least 1, got 0"),
        ("optimizer=nope: no variable", "optimizer", "--opt nope: no variable"),
        (
            ("hold a, b; name one with ", Option("optimizer", "NAME")),
            "optimizer",
            "hold a, b; name one with --opt NAME",
        ),
        (
            ("the file exists; ", Option("force", True), " replaces it"),
            "force",
            "the file exists; --force replaces it",
        ),
        ("unknown loss 'x'", "loss", "--loss: unknown loss 'x'"),
        ("bad value lr=-1: must be > 0", "lr", "bad value lr=-1: must be > 0"),
        ("epochs_total is wrong", "epochs", "--epochs: epochs_total is wrong"),
        ("accumulate: 0 batches", "accumulate", "--accum: 0 batches"),
        (("run ", Call("lr_find", options=(("apply", True),))), None, "run %lr_find --apply"),
    ],
)
def test_explain_names_the_flag(message, param, said):
    magic = {"force": "tm", "lr": "unfreeze"}.get(param, "fit")
    topic = next(t for t in TOPICS if magic in t.magics["line"])
    error = TorchMagicError(message, param=param)
    assert explain(error, getattr(topic, topic.magics["line"][magic])) == said


def test_explain_names_the_flag_and_appends_no_usage():
    error = TorchMagicError("max_steps must be at least 1, got 0", param="max_steps")
    assert explain(error, TrainingMagics.fit) == "--max-steps must be at least 1, got 0"
    assert explain(TorchMagicError("nothing to undo"), TrainingMagics.fit) == "nothing to undo"


def test_options_in_a_message_read_as_python_in_a_script():
    error = TorchMagicError(("name one with ", Option("optimizer", "NAME")), param="optimizer")
    assert str(error) == "name one with optimizer=NAME"


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
            if not hasattr(method, "usage"):
                continue
            options = list(usage_of(method).options)
            for option in options:
                if option.startswith("--") and option[:-1] not in options:
                    yield pytest.param(method, option, option[:-1], id=option[:-1])


@pytest.mark.parametrize("method, option, abbreviation", list(_long_options()))
def test_an_abbreviated_option_is_refused_with_the_whole_name(method, option, abbreviation):
    positionals = [a for a in usage_of(method).arguments if a.positional]
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
