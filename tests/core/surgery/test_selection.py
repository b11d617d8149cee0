import pytest
import torch
from torch import nn

from torchmagic import TorchMagicError
from torchmagic.core.surgery.grammar import parse_targets
from torchmagic.core.surgery.selection import select


def names(model, *targets, exclude=()):
    return select(model, parse_targets(targets), parse_targets(exclude)).names


def test_sibling_range(resnet):
    assert names(resnet, "layer1-3") == ("layer1", "layer2", "layer3")


def test_index_range_on_sequential():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(8)])
    assert names(model, "0-6") == tuple(str(i) for i in range(7))
    assert names(model, "-1") == ("7",)


def test_nested_path_and_module_order(resnet):
    assert names(resnet, "fc", "layer2.1", "layer2") == ("layer2", "fc")


def test_except_splits_the_model_into_the_rest(resnet):
    blocks = names(resnet, exclude=["fc"])
    assert blocks == (
        "conv1",
        "bn1",
        "relu",
        "maxpool",
        "layer1",
        "layer2",
        "layer3",
        "layer4",
        "avgpool",
    )
    sel = select(resnet, (), parse_targets(["fc"]))
    assert {id(p) for p in sel.parameters()} == {
        id(p) for n, p in resnet.named_parameters() if not n.startswith("fc.")
    }


def test_except_deep_inside_a_block(resnet):
    sel = select(resnet, parse_targets(["layer4"]), parse_targets(["layer4.1.bn2"]))
    got = {id(p) for p in sel.parameters()}
    want = {id(p) for n, p in resnet.layer4.named_parameters() if not n.startswith("1.bn2")}
    assert got == want


def test_glob(resnet):
    assert names(resnet, "layer1.*.bn1") == ("layer1.0.bn1", "layer1.1.bn1")
    assert len(names(resnet, "*.bn*")) == 16


def test_typo_suggests_close_names(resnet):
    with pytest.raises(TorchMagicError, match="did you mean layer1"):
        names(resnet, "layr1")
    with pytest.raises(TorchMagicError, match="no module 'layer5-6'"):
        names(resnet, "layer5-6")
    with pytest.raises(TorchMagicError, match="matches no module"):
        names(resnet, "*.nothing*")


def test_seen_through_wrappers(resnet):
    wrapped = nn.DataParallel(resnet)
    assert select(wrapped, parse_targets(["layer1"])).blocks[0].module is resnet.layer1
    assert names(wrapped, "module.layer1") == ("layer1",)
    compiled = torch.compile(resnet)
    assert select(compiled, parse_targets(["fc"])).blocks[0].module is resnet.fc


def test_tied_parameters_once():
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    assert len(select(model, ()).parameters()) == 1
