import pytest

from torchmagic import TorchMagicError
from torchmagic.core.surgery.grammar import (
    parse_lr,
    parse_target,
    split_options,
    spread_lrs,
)


def test_sibling_range_expands_names():
    target = parse_target("model.layer1-3")
    assert [s.text for s in target.segments] == ["model", "layer1-3"]
    assert list(target.segments[1].names()) == ["layer1", "layer2", "layer3"]
    assert target.head == "model"


def test_index_range_and_negative_index():
    assert list(parse_target("features.0-2").segments[1].names()) == ["0", "1", "2"]
    assert list(parse_target("classifier.-1").segments[1].names()) == ["-1"]


def test_glob_is_kept_whole():
    target = parse_target("*.bn*")
    assert target.glob == "*.bn*" and target.head is None
    rooted = parse_target("model.layer1.*")
    assert rooted.head == "model" and rooted.without_head().glob == "layer1.*"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("layer3-1", "must not exceed"),
        ("model..fc", "empty part"),
        ("model.fc;import os", "is not a name"),
        ("__import__('os')", "is not a name"),
        ("", "empty target"),
    ],
)
def test_bad_targets_are_refused(text, fragment):
    with pytest.raises(TorchMagicError, match=fragment):
        parse_target(text)


def test_lr_forms():
    assert parse_lr("1e-4") == 1e-4
    assert parse_lr("1e-5:1e-3") == (1e-5, 1e-3)
    for bad in ("abc", "-1", "0", "nan", "inf", "1e-4:", "1e-4:x", "2**3"):
        with pytest.raises(TorchMagicError):
            parse_lr(bad)


def test_split_options():
    targets, options = split_options(["layer4", "lr=1e-4", "*.bn*"], ["lr", "wd"])
    assert targets == ["layer4", "*.bn*"] and options == {"lr": "1e-4"}
    with pytest.raises(TorchMagicError, match="unknown option 'momentum='"):
        split_options(["layer4", "momentum=0.9"], ["lr", "wd"])
    with pytest.raises(TorchMagicError, match="given twice"):
        split_options(["lr=1", "lr=2"], ["lr"])


def test_geometric_spread():
    lrs = spread_lrs((1e-5, 1e-3), 3)
    assert lrs[0] == pytest.approx(1e-5) and lrs[1] == pytest.approx(1e-4)
    assert lrs[2] == pytest.approx(1e-3)
    assert spread_lrs((1e-5, 1e-3), 1) == [1e-3]
    assert spread_lrs(1e-4, 2) == [1e-4, 1e-4]


def test_input_shapes():
    from torchmagic.core.surgery.grammar import parse_shape

    assert parse_shape("1,3,224,224") == (1, 3, 224, 224)
    assert parse_shape("8x3x32x32") == (8, 3, 32, 32)
    for bad in ("1,a", "0,3", "1,-3", "(1,3)", "__import__('os')"):
        with pytest.raises(TorchMagicError):
            parse_shape(bad)
