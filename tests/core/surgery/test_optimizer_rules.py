"""Optimizers with rules of their own: Muon takes 2-D parameters only, SparseAdam sparse
gradients only, LBFGS one group it caches; Adam may be given its lr as a tensor. Each
command is exact (the same edit by hand) or one line with nothing changed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def _refused(tm: Session, call, *watched) -> str:
    """The one-line refusal of ``call``, after checking that every (model, optimizer) in
    ``watched`` is exactly as before and nothing entered the history."""
    before = [snapshot(model, opt) for model, opt in watched]
    with pytest.raises(TorchMagicError) as info:
        call(tm)
    for snap, (model, opt) in zip(before, watched, strict=True):
        assert_same(snap, snapshot(model, opt))
    assert not tm.history()
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon is newer")
def test_muon_never_gets_a_bias_or_a_norm():
    model = _mlp()
    for p in [*model[0].parameters(), *model[1].parameters()]:
        p.requires_grad_(False)
    muon = torch.optim.Muon([model[2].weight], lr=1e-3)
    adam = torch.optim.AdamW([model[2].bias], lr=1e-3)
    tm = Session(namespace={"m": model, "muon": muon, "adam": adam})
    message = _refused(
        tm,
        lambda t: t.unfreeze("m.0", "m.1", lr=1e-4, optimizer="muon"),
        (model, muon),
        (model, adam),
    )
    assert "Muon takes 2-D parameters only" in message and "0.bias" in message
    assert "optimizer=NAME" in message


def test_sparse_adam_never_gets_a_dense_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 3))
    for p in model[1].parameters():
        p.requires_grad_(False)
    sparse = torch.optim.SparseAdam(list(model[0].parameters()))
    tm = Session(namespace={"m": model, "sparse": sparse})
    message = _refused(
        tm, lambda t: t.unfreeze("m.1", lr=1e-3, optimizer="sparse"), (model, sparse)
    )
    assert "SparseAdam takes sparse gradients only" in message and "1.weight" in message


def test_lbfgs_refusal_says_how_to_go_on():
    model = _mlp()
    opt = torch.optim.LBFGS(model.parameters())
    message = _refused(Session(model, opt), lambda t: t.freeze("0"), (model, opt))
    assert "do the surgery first, then create the optimizer" in message


def _steps(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    torch.manual_seed(1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()


def test_a_tensor_lr_stays_a_tensor_in_new_groups_as_by_hand():
    def build():
        model = _mlp()
        for p in model[0].parameters():
            p.requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        return model, torch.optim.Adam(trainable, lr=torch.tensor(1e-3))

    model, opt = build()
    Session(model, opt).unfreeze("0", lr=1e-4)
    new = opt.param_groups[-1]
    assert isinstance(new["lr"], torch.Tensor) and float(new["lr"]) == pytest.approx(1e-4)

    hand, hand_opt = build()
    for p in hand[0].parameters():
        p.requires_grad_(True)
    hand_opt.add_param_group({"params": list(hand[0].parameters()), "lr": torch.tensor(1e-4)})

    _steps(model, opt)
    _steps(hand, hand_opt)
    for (name, a), b in zip(model.named_parameters(), hand.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_relative_step_adafactor_is_edited_without_lrs_and_lr_is_one_line():
    """transformers' Adafactor as its docs build it (lr=None, relative_step=True): a freeze
    and an unfreeze back home work exactly as by hand; lr= is refused in one line."""
    optimization = pytest.importorskip("transformers.optimization")

    def build():
        model = _mlp()
        opt = optimization.Adafactor(
            model.parameters(), lr=None, relative_step=True, warmup_init=True
        )
        _steps(model, opt)
        return model, opt

    model, opt = build()
    tm = Session(model, opt)
    tm.freeze("0")
    tm.unfreeze("0")
    assert tm.summary().groups[0].lr is None
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError) as refused:
        tm.unfreeze("0", lr=1e-3)
    assert "computes its own lr" in str(refused.value) and "\n" not in str(refused.value)
    assert_same(before, snapshot(model, opt))
    assert len(tm.history()) == 2

    hand, hand_opt = build()  # by hand: layer 0 out and back in its group, state dropped
    group = hand_opt.param_groups[0]
    first = list(hand[0].parameters())
    group["params"] = [p for p in group["params"] if all(p is not q for q in first)] + first
    for p in first:
        hand_opt.state.pop(p, None)
    _steps(model, opt)
    _steps(hand, hand_opt)
    for (name, a), b in zip(model.named_parameters(), hand.parameters(), strict=True):
        assert torch.equal(a, b), name
