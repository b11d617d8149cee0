"""Bad input the fuzzer found giving tracebacks: each is one UsageError line
and changes nothing."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.core.surgery import heads
from torchmagic.core.surgery.grammar import parse_segment, parse_shape, spread_lrs

SETUP = """
import torch
from collections import OrderedDict
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(OrderedDict(
    layer1=nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)),
    layer2=nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)),
    pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), fc=nn.Linear(4, 3),
))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(2, 3, 4, 4)).sum().backward()
optimizer.step()
pairs = [1, 2, 3]
"""

BAD = [
    ("freeze", "layer1 'a", "close the quote"),
    ("freeze", "layer1\\", "escape the backslash"),
    ("tm", 'use "model', "no closing quotation"),
    ("amp", "on '", "no closing quotation"),
    ("device", "\\", "no escaped character"),
    ("gpumem", "estimate '", "close the quote"),
    ("replace_head", "fc 99999999999999999999", "num_classes"),
    ("replace_head", "fc 100000000000", "more than 1,000,000 classes"),
    ("replace_head", "fc 1" + "0" * 5000, "too large"),
    ("replace_head", "fc ١٠", "whole number"),
    ("gpumem", "estimate --input-shape ²", "positive integers"),
    ("gpumem", "estimate --input-shape 99999999999,3,224,224", "more than any device holds"),
    ("gpumem", "estimate --input-shape 99999999999999999999,3", "positive integers"),
    ("fit", "pairs", "train"),
    ("fit", "model", "train"),
    ("freeze", "layer1-30000000", "layer3-30000000 do not exist, layer1-2 do"),
    ("freeze", "layer1-9", "'layer1-9' reaches past what the model (Sequential) has: layer3-9"),
    ("freeze", "modle.layer1", "did you mean the variable 'model'?"),
    ("freeze", "0-99999999999", "no module '0-99999999999'"),
    ("freeze", "layer1-" + "9" * 50, "too large"),
    ("freeze", "fc" + "0" * 5000, "no module"),
    ("freeze", "layer1.-²", "bad target"),
    ("unfreeze", "layer1.١", "bad target"),
]


@pytest.mark.parametrize("magic, line, fragment", BAD, ids=[f"{m} {li[:30]}" for m, li, _ in BAD])
def test_bad_input_is_one_usage_error_and_changes_nothing(ip, magic, line, fragment):
    ip.run_cell(SETUP).raise_error()
    model, opt = ip.user_ns["model"], ip.user_ns["optimizer"]
    before = snapshot(model, opt)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic(magic, line)
    assert type(info.value) is UsageError
    assert fragment.lower() in str(info.value).lower() and "\n" not in str(info.value)
    assert_same(before, snapshot(model, opt))


def test_a_huge_range_stops_at_the_real_children():
    """``layer1-30000000`` used to build 30M names (8 s, 2 GiB) before refusing."""
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(3)))
    segment = parse_segment("0-30000000", "0-30000000")
    names = segment.names()
    assert [next(names) for _ in range(4)] == ["0", "1", "2", "3"]  # lazily, one at a time
    with pytest.raises(TorchMagicError, match="3-30000000 do not exist, 0-2 do"):
        Session(model, torch.optim.SGD(model.parameters(), lr=0.1)).freeze("0-30000000")


def test_summary_with_a_huge_depth_shows_the_whole_tree():
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    report = Session(model).summary(depth=10**20)
    assert {row.name for row in report.rows} >= {"0", "0.0", "1"}


def test_a_geometric_spread_never_overflows():
    lrs = spread_lrs((1e-300, 1e300), 3)
    assert lrs == pytest.approx([1e-300, 1.0, 1e300], rel=1e-9)
    assert spread_lrs((1e-5, 1e-3), 3) == pytest.approx([1e-5, 1e-4, 1e-3])
    assert spread_lrs((1e-300, 1e-300), 4) == pytest.approx([1e-300] * 4)


def test_unfreeze_with_an_extreme_spread_gives_finite_lrs():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    for p in [*model[0].parameters(), *model[1].parameters()]:
        p.requires_grad_(False)
    Session(model, opt).unfreeze("0-1", lr=(1e-300, 1e300))
    assert [g["lr"] for g in opt.param_groups[1:]] == pytest.approx([1e-300, 1e300])


def test_input_shape_takes_ascii_digits_only():
    assert parse_shape("2x3x8x8") == (2, 3, 8, 8)
    for text in ("²", "١,3", "2,", "9" * 19, "0,3"):
        with pytest.raises(TorchMagicError):
            parse_shape(text)


def test_a_head_too_big_for_memory_is_refused_before_allocating(monkeypatch):
    model = nn.Sequential(nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model, opt)
    monkeypatch.setattr(heads, "machine_memory", lambda: (1000, 2000))
    with pytest.raises(TorchMagicError, match="needs .* GiB"):
        Session(model, opt).replace_head("0", 100)  # 100 * (8 + 1) * 4 bytes > 1000
    assert_same(before, snapshot(model, opt))
    with pytest.raises(TorchMagicError, match="more than 1,000,000 classes"):
        Session(model, opt).replace_head("0", 10**6 + 1)
