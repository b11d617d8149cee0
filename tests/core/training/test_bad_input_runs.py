"""Bad input deep inside a run: a label past the head's outputs at any batch
is one line naming the label, the head's size and the fix; a count too large for torch is
refused before anything runs (in fine_tune before its freeze is applied or recorded)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from IPython.core.error import UsageError
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.magics.extension import loaded

HUGE = 99999999999999999999


def build() -> tuple[nn.Module, torch.optim.Optimizer, list]:
    """A tiny classifier with 3 outputs and four good batches."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("body", nn.Linear(6, 8))
    model.add_module("act", nn.ReLU())
    model.add_module("fc", nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = [(torch.randn(4, 6), torch.tensor([0, 1, 2, 1])) for _ in range(4)]
    return model, opt, batches


def with_label(batches: list, index: int, label: int) -> list:
    inputs, targets = batches[index]
    bad = targets.clone()
    bad[2] = label
    return [*batches[:index], (inputs, bad), *batches[index + 1 :]]


def setup(ip, train: list) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt, _ = build()
    ip.user_ns.update(model=model, optimizer=opt, train=train)
    return model, opt


@pytest.mark.parametrize("accum", ["", " --accum 2"])
def test_a_label_past_the_head_on_the_first_batch_is_one_line_and_changes_nothing(ip, accum):
    _, _, good = build()
    model, opt = setup(ip, with_label(good, 0, 7))
    before = snapshot(model, opt)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("fit", "train" + accum)
    message = str(info.value)
    assert type(info.value) is UsageError and "\n" not in message
    assert "label 7" in message and "model.fc has 3 outputs" in message
    assert "%replace_head model.fc 8" in message
    assert_same(before, snapshot(model, opt))


@pytest.mark.parametrize("accum", ["", " --accum 2"])
def test_a_label_past_the_head_mid_run_is_one_line_after_the_steps_before_it(ip, accum):
    """The steps before the bad batch trained, exactly as the same loop by hand; then one
    line, groups and flags as they were."""
    _, _, good = build()
    model, opt = setup(ip, with_label(good, 2, 5))
    twin, twin_opt = copy.deepcopy(model), None
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    every = 2 if accum else 1
    for start in range(0, 2, every):  # the batches before the bad one, in whole windows
        for inputs, targets in good[start : start + every]:
            loss = F.cross_entropy(twin(inputs), targets)
            (loss / every if every > 1 else loss).backward()
        twin_opt.step()
        twin_opt.zero_grad(set_to_none=True)
    groups = [[id(p) for p in g["params"]] for g in opt.param_groups]
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("fit", "train" + accum)
    message = str(info.value)
    assert type(info.value) is UsageError and "\n" not in message
    assert "label 5" in message and "3 outputs" in message and "%replace_head model.fc 6" in message
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(mine, theirs) and mine.requires_grad and mine.grad is None
    assert [[id(p) for p in g["params"]] for g in opt.param_groups] == groups


def test_a_negative_label_says_to_map_the_labels():
    model, opt, good = build()
    tm = Session(model, opt)
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match=r"label -3 .* 3 outputs .*map the labels to 0\.\.2"):
        tm.fit(with_label(good, 0, -3))
    assert_same(before, snapshot(model, opt))


def test_the_api_names_the_session_call():
    model, opt, good = build()
    tm = Session(model, opt)
    with pytest.raises(TorchMagicError) as info:
        tm.fit(with_label(good, 1, 9), accumulate=2)
    assert 'tm.replace_head("model.fc", 10)' in str(info.value)


def test_ignored_labels_still_train():
    """-100 is cross_entropy's "no label": not a label past the head."""
    model, opt, good = build()
    history = Session(model, opt).fit(with_label(good, 0, -100))
    assert history.steps == 4


@pytest.mark.parametrize(
    "magic, line, flag",
    [
        ("fit", f"train --accum {HUGE}", "--accum"),
        ("fit", f"train --epochs {HUGE}", "--epochs"),
        ("fit", f"train --max-steps {HUGE}", "--max-steps"),
        ("fine_tune", f"train --val train --epochs 1 --accum {HUGE}", "--accum"),
        ("fine_tune", f"train --val train --epochs {HUGE}", "--epochs"),
        ("fine_tune", f"train --val train --epochs 1 --freeze-epochs {HUGE}", "--freeze-epochs"),
    ],
)
def test_a_huge_count_is_refused_before_anything_runs(ip, magic, line, flag):
    _, _, good = build()
    model, opt = setup(ip, good)
    before = snapshot(model, opt)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic(magic, line)
    message = str(info.value)
    assert type(info.value) is UsageError and "\n" not in message
    assert message.startswith(f"{flag} must be at most 2147483647, got {HUGE}")
    assert_same(before, snapshot(model, opt))
    assert loaded(ip).session.history() == ()  # fine_tune's freeze was not recorded


@pytest.mark.parametrize(
    "call",
    [
        lambda tm, data: tm.fit(data, accumulate=HUGE),
        lambda tm, data: tm.fine_tune(data, val=data, epochs=1, accumulate=HUGE),
        lambda tm, data: tm.fine_tune(data, val=data, epochs=1, freeze_epochs=HUGE),
        lambda tm, data: tm.lr_find(data, steps=HUGE),
    ],
)
def test_the_api_refuses_a_huge_count_and_changes_nothing(call):
    model, opt, good = build()
    tm = Session(model, opt)
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="must be at most 2147483647"):
        call(tm, good)
    assert_same(before, snapshot(model, opt))
    assert tm.history() == ()
