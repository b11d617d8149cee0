"""What a notebook receives from a real ipykernel for %fit: the progress and then the
result in one display output (updated in place), and no ``execute_result`` repeating it
when the magic is the cell's last line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from real_kernel import real_kernel

TIMEOUT_S = 120
SETUP = """
%load_ext torchmagic
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x, y = torch.randn(40, 4), torch.arange(40) % 2
train = DataLoader(TensorDataset(x, y), batch_size=10)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A kernel of this interpreter, this tree's torchmagic first on its path."""
    with real_kernel(tmp_path_factory.mktemp("kernels"), SETUP, TIMEOUT_S) as client:
        yield client


def _messages(client, code: str) -> list[dict]:
    """The iopub messages of one execution that carry output."""
    kept: list[dict] = []

    def keep(msg: dict) -> None:
        if msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            kept.append(msg)

    reply = client.execute_interactive(code, timeout=TIMEOUT_S, output_hook=keep)
    assert reply["content"]["status"] == "ok", reply["content"]
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("code", ["%fit train --epochs 2", "h = %fit train --epochs 2\nx = 1"])
def test_the_result_replaces_the_progress_and_is_not_repeated(kernel, code: str) -> None:
    messages = _messages(kernel, code)
    assert [m for m in messages if m["msg_type"] == "execute_result"] == []
    first, *updates = messages
    assert first["msg_type"] == "display_data" and updates
    display_id = first["content"]["transient"]["display_id"]
    assert all(m["msg_type"] == "update_display_data" for m in updates)
    assert {m["content"]["transient"]["display_id"] for m in updates} == {display_id}
    last = updates[-1]["content"]["data"]
    assert "completed" in last["text/plain"] and "<svg" in last["text/html"]
    assert "epochs in" not in last["text/plain"]  # the progress's closing line is gone


@pytest.mark.slow
def test_the_returned_history_shows_in_a_later_cell(kernel) -> None:
    _messages(kernel, "h = %fit train --epochs 1")
    (result,) = _messages(kernel, "h")
    assert result["msg_type"] == "display_data"
    assert "completed" in result["content"]["data"]["text/plain"]
