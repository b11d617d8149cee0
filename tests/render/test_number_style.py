"""One number style in every output: ``1e-5`` (never Python's ``1e-05``) in tables,
history and the commands it lists; a share too small for one decimal reads "<0.1%"."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from IPython.utils.capture import capture_output
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchmagic import Session, render
from torchmagic.core.advice import spelled
from torchmagic.core.numbers import short


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e-5, "1e-5"),
        (2.45e-6, "2.45e-6"),
        (1e-4, "1e-4"),
        (0.001, "0.001"),
        (0.01, "0.01"),
        (0.3, "0.3"),
        (0.0, "0"),
        (-1e-5, "-1e-5"),
        (1234567.0, "1.23e6"),
    ],
)
def test_short_numbers(value: float, text: str) -> None:
    assert short(value) == text
    assert float(text) == pytest.approx(value, rel=5e-3)  # it reads back as typed


def _outputs(ip, magic: str, line: str) -> str:
    with capture_output() as cap:
        ip.run_line_magic(magic, line)
    return "\n".join(o.data[t] for o in cap.outputs for t in ("text/plain", "text/html"))


def test_history_writes_lrs_as_tables_do(ip) -> None:
    """%fine_tune's unfreeze spreads 1e-3 / 100 = 1e-5: the history and the groups table
    write it the same way."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(body=nn.Linear(8, 16), act=nn.ReLU(), fc=nn.Linear(16, 4)))
    data = TensorDataset(torch.randn(32, 8), torch.arange(32) % 4)
    ip.user_ns.update(
        model=model,
        opt=torch.optim.SGD(model.parameters(), lr=0.1),
        train_loader=DataLoader(data, batch_size=8),
        val_loader=DataLoader(data, batch_size=16),
    )
    shown = _outputs(ip, "fine_tune", "train_loader --val val_loader --epochs 1 --lr 1e-3")
    history = _outputs(ip, "tm", "history")
    assert "lr=1e-5:0.001" in history
    assert "1e-5" in shown
    assert "e-0" not in shown + history


def test_session_calls_write_lrs_as_typed() -> None:
    model = nn.Sequential(OrderedDict(body=nn.Linear(2, 2), fc=nn.Linear(2, 2)))
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tm.freeze("body")
    tm.unfreeze("body", lr=1e-5)
    (_, entry) = tm.history()
    assert spelled(entry.command) == 'tm.unfreeze("body", lr=1e-5)'
    text = str(render.history(tm.history(), width=200))
    assert "lr=1e-5)" in text and "e-05" not in text


def test_a_small_share_is_not_zero(resnet) -> None:
    """A 5-class head of resnet18 trains 2.56k of 11.2M parameters (0.02 %)."""
    tm = Session(resnet, torch.optim.AdamW(resnet.parameters()))
    frozen = str(render.render(tm.freeze("model")))
    assert "(0.0% of 11.7M)" in frozen  # none is none
    change = str(render.render(tm.replace_head("model.fc", 5)))
    assert "trainable 0 → 2.56k (<0.1% of 11.2M)" in change
    summary = " ".join(str(render.render(tm.summary(), width=200)).split())
    assert "trainable 2.56k (<0.1%)" in summary
    unfrozen = str(render.render(tm.unfreeze("model.layer4")))
    assert "(75.1% of 11.2M)" in unfrozen
