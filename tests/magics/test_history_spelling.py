"""``%tm history`` lists every entry as the magic a user would type, also the commands
a magic ran for the user (``%fine_tune``'s freeze and unfreeze, ``%lr_find --apply``);
Python sessions see the same entries as session calls."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import torch
from IPython.utils.capture import capture_output
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchmagic import Session
from torchmagic.core.advice import Call, spelled
from torchmagic.core.session import fit_runs as session_module
from torchmagic.magics.extension import loaded
from torchmagic.magics.spelling import magic_line


def _setup(ip) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(body=nn.Linear(8, 16), act=nn.ReLU(), fc=nn.Linear(16, 4)))
    data = TensorDataset(torch.randn(32, 8), torch.arange(32) % 4)
    ip.user_ns.update(
        model=model,
        opt=torch.optim.SGD(model.parameters(), lr=0.1),
        train_loader=DataLoader(data, batch_size=8),
        val_loader=DataLoader(data, batch_size=16),
    )


def _history_text(ip) -> str:
    with capture_output() as cap:
        ip.run_line_magic("tm", "history")
    return cap.outputs[0].data["text/plain"]


def test_commands_a_magic_ran_read_as_magics(ip) -> None:
    _setup(ip)
    with capture_output():
        ip.run_line_magic("fine_tune", "train_loader --val val_loader --epochs 1 --lr 1e-2")
    session = loaded(ip).session
    entries = [spelled(e.command, magic_line) for e in session.history()]
    assert entries == ["%freeze model --except fc", "%unfreeze model body fc lr=1e-4:0.01"]
    text = _history_text(ip)
    assert "%freeze model --except fc" in text and "freeze('model'" not in text
    assert "tm." not in text


def test_lr_find_apply_names_the_group(ip, monkeypatch) -> None:
    """An unnamed group reads "group 0" (not "0", a Sequential child's name)."""
    real = session_module.find_lr
    monkeypatch.setattr(
        session_module, "find_lr", lambda *a, **k: replace(real(*a, **k), suggestion=1e-3)
    )
    _setup(ip)
    with capture_output():
        ip.run_line_magic("lr_find", "train_loader --steps 12 --apply")
    (entry,) = loaded(ip).session.history()
    assert spelled(entry.command, magic_line) == (
        "%lr_find --apply: base lr 0.001 for group 0, others in proportion"
    )
    assert ip.user_ns["opt"].param_groups[0]["lr"] == 1e-3


def test_save_lists_lr_find_apply_as_history_does(ip, monkeypatch, tmp_path) -> None:
    """``%tm save`` names the commands it wrote the way ``%tm history`` does."""
    real = session_module.find_lr
    monkeypatch.setattr(
        session_module, "find_lr", lambda *a, **k: replace(real(*a, **k), suggestion=1e-3)
    )
    _setup(ip)
    with capture_output():
        ip.run_line_magic("lr_find", "train_loader --steps 12 --apply")
    with capture_output() as cap:
        ip.run_line_magic("tm", f"save {tmp_path / 'run.pt'}")
    saved = cap.outputs[0].data["text/plain"]
    line = "%lr_find --apply: base lr 0.001 for group 0, others in proportion"
    assert f"1. {line}" in saved and line in _history_text(ip)
    assert "tm.lr_find" not in saved


def test_undo_names_the_magic(ip) -> None:
    _setup(ip)
    with capture_output():
        ip.run_line_magic("fine_tune", "train_loader --val val_loader --epochs 1")
    with capture_output() as cap:
        ip.run_line_magic("tm", "undo")
    assert "undid: %unfreeze model body fc lr=" in cap.outputs[0].data["text/plain"]


def test_python_sessions_see_session_calls() -> None:
    model = nn.Sequential(OrderedDict(body=nn.Linear(2, 2), fc=nn.Linear(2, 2)))
    tm = Session(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tm.freeze("body", bn="train")
    tm.unfreeze("body", lr=(1e-4, 1e-3))
    tm.replace_head("fc", 3)
    assert [spelled(e.command) for e in tm.history()] == [
        'tm.freeze("body", bn="train")',
        'tm.unfreeze("body", lr=(1e-4, 0.001))',
        'tm.replace_head("fc", 3)',
    ]


def test_options_take_the_magics_own_flags() -> None:
    assert magic_line(Call("freeze", ("model",), (("exclude", ("fc", "bn1")),))) == (
        "%freeze model --except fc bn1"
    )
    assert magic_line(Call("lr_find", (), (("apply", True),))) == "%lr_find --apply"
    assert (
        magic_line(Call("unfreeze", ("layer4",), (("lr", "1e-4"),))) == "%unfreeze layer4 lr=1e-4"
    )
    assert magic_line(Call("replace_head", ("fc", 5), (("dropout", 0.2),))) == (
        "%replace_head fc 5 --dropout 0.2"
    )
