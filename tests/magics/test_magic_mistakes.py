"""Every magic's typical mistakes: one line, the problem and its fix, never
the usage appended (``%magic?`` shows it); nothing changes."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from snapshots import assert_same, snapshot

SETUP = """
import torch
from collections import OrderedDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = nn.Sequential(OrderedDict(
    conv=nn.Conv2d(3, 4, 3), bn=nn.BatchNorm2d(4), pool=nn.AdaptiveAvgPool2d(1),
    flat=nn.Flatten(), layer4=nn.Linear(4, 4), fc=nn.Linear(4, 3),
))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,)))
train_loader = DataLoader(data, batch_size=4)
val_loader = DataLoader(data, batch_size=4)
"""

# (line, the message, or its start when it ends with "…")
MISTAKES = [
    (
        "%device move cuda",
        "'cuda' is a device, not a model: %device cuda chooses it, then "
        "%device move moves the model there",
    ),
    (
        "%fit val_loader train_loader",
        "'val_loader' is a DataLoader, not a model: the model "
        "comes first (none: the current one), then the training loader; a validation loader "
        "goes in --val LOADER",
    ),
    (
        "%lr_find val_loader train_loader",
        "'val_loader' is a DataLoader, not a model: the "
        "model comes first (none: the current one), then the training loader",
    ),
    (
        "%unfreeze layer4 lr=1e-4:",
        "lr=1e-4:: a discriminative range needs both ends, e.g. "
        "lr=1e-5:1e-4 (the first block's lr, then the last one's)",
    ),
    ("%unfreeze layer4 lr=:1e-4", "lr=:1e-4: a discriminative range needs both ends…"),
    (
        "%fit train_loader --loss crossentropy",
        "--loss: unknown loss 'crossentropy'; did you "
        "mean cross_entropy? (or the name of a loss function you defined)",
    ),
    (
        "%fit train_loader --loss CrossEntropyLoss",
        "--loss: unknown loss 'CrossEntropyLoss'; did you mean cross_entropy?…",
    ),
    ("%gpumem batch", "%gpumem batch needs --input-shape SHAPE"),
    (
        "%summary --input-shape 3,32",
        "--input-shape (3, 32) does not fit the model: conv "
        "(Conv2d) takes (batch, 3, H, W); give the shape batch first, e.g. (1, 3, 224, 224), "
        "or leave it out",
    ),
    ("%fit train_loader --epoch 2", "unknown option --epoch; did you mean --epochs?"),
    (
        "%fine_tune train_loader --va val_loader --epochs 2",
        "unknown option --va; did you mean --val?",
    ),
    ("%fit", "missing [MODEL] TRAIN_LOADER; %fit? shows the usage"),
    ("%fit a b c", "one model and one training loader, got 3 words: a b c"),
    ("%freeze", "name what to freeze…"),
    (
        "%freeze conv --bn frozn",
        "--bn takes eval | train | frozen, got 'frozn'; did you mean frozen?",
    ),
    ("%replace_head fc 10 extra", "one head and one class count, e.g. fc 10, got fc 10 extra"),
    ("%summary --depth x", "--depth takes a whole number, got 'x'"),
    ("%lora --opt", "--opt needs NAME after it"),
    ("%load_model", "missing NAME; %load_model? shows the usage"),
    ("%tm", "%tm needs a subcommand; %tm? lists them"),
    ("%tm histroy", "unknown subcommand 'histroy' of %tm; did you mean %tm history?"),
    ("%tm use", "%tm use needs NAME: %tm use NAME"),
    ("%tm undo now", "%tm undo takes no more words, got 'now'"),
    ("%tm history --sync", "--sync goes with %tm save"),
    ("%device cpu extra", "%device takes cuda:N|cpu|mps|auto, got 'cpu extra'"),
    ("%device pinbench", "%device pinbench needs LOADER: %device pinbench LOADER"),
    ("%gpumem watch maybe", "watch takes on or off, got 'maybe'"),
    ("%amp on fp16 bf16", "%amp on takes [auto|bf16|fp16], got 'fp16 bf16'"),
    ("%freeze conv 'x", "cannot read the line: no closing quotation; close the quote"),
]


@pytest.mark.parametrize("line, said", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_is_one_line_with_its_fix(ip, line, said):
    ip.run_line_magic("config", "TorchMagics.width = 80")
    ip.run_cell(SETUP).raise_error()
    model, opt = ip.user_ns["model"], ip.user_ns["optimizer"]
    before = snapshot(model, opt)
    magic, _, rest = line[1:].partition(" ")
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic(magic, rest)
    text = str(refused.value)
    assert type(refused.value) is UsageError
    assert "\n" not in text and len(text) <= 160 and "usage:" not in text, text
    assert text.startswith(said[:-1]) if said.endswith("…") else text == said
    assert "Error" not in text  # no exception of torch's embedded
    assert_same(before, snapshot(model, opt))
    assert not opt.state


def test_a_misspelt_magic_gets_the_nearest_one(ip):
    with capture_output() as captured:
        result = ip.run_cell("%freez layer1")
    assert isinstance(result.error_in_exec, UsageError)
    assert captured.stdout == "%freez: did you mean %freeze?\n"
    with capture_output() as captured:
        ip.run_cell("%qwertyuiop")
    assert captured.stdout == ""  # nothing close: IPython's refusal alone


def test_device_move_to_a_device_variable_still_moves_that_model(ip):
    ip.run_cell(SETUP + "cuda = model\n").raise_error()  # a variable of that name wins
    with capture_output():
        ip.run_line_magic("device", "move cuda")
    assert next(ip.user_ns["model"].parameters()).device == torch.device("cpu")
