from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from builders import batchnorm_mlp, blobs
from torchmagic import Session, TorchMagicError
from torchmagic.core.training.recipe import fine_tune_blocks
from torchmagic.render import render


def build():
    model, opt = batchnorm_mlp()
    x, y = blobs(120)
    train = DataLoader(
        TensorDataset(x, y), batch_size=30, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    val = DataLoader(TensorDataset(*blobs(40, seed=1)), batch_size=40)
    return model, opt, train, val


def test_the_recipe_equals_its_four_commands_bit_for_bit():
    model_a, opt_a, train_a, val_a = build()
    tm_a = Session(model_a, opt_a)
    result = tm_a.fine_tune(train_a, val=val_a, epochs=2, freeze_epochs=1, lr=3e-3)

    model_b, opt_b, train_b, val_b = build()
    tm_b = Session(model_b, opt_b)
    tm_b.freeze("model", exclude=["fc"])
    tm_b.fit(train_b, val=val_b, epochs=1)
    tm_b.unfreeze("model", "body", "norm", "mid", "fc", lr=(3e-5, 3e-3))
    tm_b.fit(train_b, val=val_b, epochs=2)

    assert result.blocks == ("body", "norm", "mid", "fc")
    assert [e.command for e in tm_a.history()] == [e.command for e in tm_b.history()]
    assert len(tm_a.fits) == 2 and result.full_fit is tm_a.fits[-1]
    a, b = model_a.state_dict(), model_b.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [g["lr"] for g in opt_a.param_groups] == [g["lr"] for g in opt_b.param_groups]
    lrs = {g.get("name"): g["lr"] for g in opt_a.param_groups if g["params"]}
    assert lrs["body"] == pytest.approx(3e-5) and lrs["fc"] == pytest.approx(3e-3)


def test_the_head_trains_alone_first_then_everything():
    model, opt, train, val = build()
    body_before = model.body.weight.clone()
    tm = Session(model, opt)
    result = tm.fine_tune(train, val=val, epochs=1)
    assert result.freeze.action == "freeze" and result.unfreeze.action == "unfreeze"
    assert result.lr == pytest.approx(1e-2)  # the head group's base lr
    assert all(p.requires_grad for p in model.parameters())
    assert not torch.equal(model.body.weight, body_before)
    assert result.head_fit.epochs[-1].val_accuracy is not None
    bundle = render(result)._repr_mimebundle_()
    assert "froze" in bundle["text/plain"] and "unfroze" in bundle["text/plain"]


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": 1, "freeze_epochs": 0}, "freeze_epochs"),
        ({"epochs": 1, "lr": -1.0}, "lr"),
    ],
)
def test_bad_input_changes_nothing(kwargs, param):
    model, opt, train, val = build()
    tm = Session(model, opt)
    with pytest.raises(TorchMagicError) as error:
        tm.fine_tune(train, val=val, **kwargs)
    assert error.value.param == param
    assert tm.history() == () and tm.fits == []
    assert all(p.requires_grad for p in model.parameters())


def test_blocks_descend_through_a_lone_wrapper():
    inner = nn.Sequential(OrderedDict(stem=nn.Linear(2, 2), act=nn.ReLU(), head=nn.Linear(2, 2)))
    wrapped = nn.Sequential(OrderedDict(net=inner, drop=nn.Dropout()))
    assert fine_tune_blocks(wrapped) == ("net.stem", "net.head")
    assert fine_tune_blocks(nn.Linear(2, 2)) == ()
