"""Tab completion as a notebook front end gets it: ``complete_request`` to a real
ipykernel after ``%load_ext torchmagic``.

The kernel runs this interpreter with this tree's ``torchmagic`` first on its path, so
the completer under test is the one registered by ``%load_ext`` in that kernel.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from real_kernel import real_kernel

TIMEOUT_S = 120
SETUP = """
%load_ext torchmagic
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
model = nn.Sequential()
model.add_module("stem", nn.Conv2d(3, 4, 3))
for i in range(1, 5):
    model.add_module(f"layer{i}", nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)))
model.add_module("pool", nn.AdaptiveAvgPool2d(1))
model.add_module("flat", nn.Flatten())
model.add_module("fc", nn.Linear(4, 2))
head = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(TensorDataset(torch.randn(4, 3, 8, 8), torch.arange(4) % 2), batch_size=2)
train_steps = 10
%tm use model
"""
CASES = {
    "%unfreeze lay": ["layer1", "layer2", "layer3", "layer4"],
    "%freeze la": ["layer1", "layer2", "layer3", "layer4"],
    "%freeze model.la": ["model.layer1", "model.layer2", "model.layer3", "model.layer4"],
    "%freeze layer1-": ["layer1-2", "layer1-3", "layer1-4"],
    "%freeze head.0-": ["head.0-1", "head.0-2"],
    "%freeze model --except f": ["flat", "fc"],
    "%freeze layer1 --ex": ["--except"],
    "%freeze --bn ": ["eval", "train", "frozen"],
    "%summary h": ["head"],
    "%replace_head a": ["auto"],
    "%tm ": ["history", "undo", "clear", "use", "fits", "doctor", "save", "load", "export", "help"],
    "%tm use ": ["model", "head"],
    "%amp o": ["on", "off"],
    "%gpumem ": ["reset", "watch", "estimate", "batch"],
    "%device m": ["move", "mps"],
    "%fit train_": ["train_loader"],
    "%fit model train_loader --val t": ["train_loader"],
    "%fit train_loader --opt ": ["opt"],
    "%lr_find ": ["model", "head", "train_loader"],
    "%fine_tune model t": ["train_loader"],
    "%load_model resnet1": ["resnet101", "resnet152", "resnet18"],
    "%tm help fi": ["fit", "fine_tune"],
}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlockingKernelClient]:
    """A kernel of this interpreter with the model above defined and the extension loaded."""
    with real_kernel(tmp_path_factory.mktemp("kernels"), SETUP, TIMEOUT_S) as client:
        yield client


def _complete(client: BlockingKernelClient, code: str) -> dict:
    msg_id = client.complete(code, len(code))
    reply = client.get_shell_msg(timeout=TIMEOUT_S)
    assert reply["parent_header"]["msg_id"] == msg_id
    return reply["content"]


@pytest.mark.slow
def test_complete_request_answers_each_case(kernel: BlockingKernelClient) -> None:
    for code, expected in CASES.items():
        content = _complete(kernel, code)
        word = code.split(" ")[-1]
        assert content["status"] == "ok"
        assert content["matches"] == expected, code
        assert (content["cursor_start"], content["cursor_end"]) == (
            len(code) - len(word),
            len(code),
        ), code


@pytest.mark.slow
def test_each_answer_says_what_it_names(kernel: BlockingKernelClient) -> None:
    content = _complete(kernel, "%lr_find ")
    types = {t["text"]: t["type"] for t in content["metadata"]["_jupyter_types_experimental"]}
    assert types == {"model": "model", "head": "model", "train_loader": "loader"}
    content = _complete(kernel, "%freeze l")
    types = {t["text"]: t["type"] for t in content["metadata"]["_jupyter_types_experimental"]}
    assert set(types.values()) == {"block"}


@pytest.mark.slow
def test_unload_ext_hands_completion_back_to_ipython(kernel: BlockingKernelClient) -> None:
    reply = kernel.execute_interactive("%unload_ext torchmagic", timeout=TIMEOUT_S)
    assert reply["content"]["status"] == "ok"
    assert "layer1" not in _complete(kernel, "%freeze la")["matches"]
    reply = kernel.execute_interactive("%load_ext torchmagic", timeout=TIMEOUT_S)
    assert reply["content"]["status"] == "ok"
    assert _complete(kernel, "%unfreeze layer4 --ex")["matches"] == ["--except"]
