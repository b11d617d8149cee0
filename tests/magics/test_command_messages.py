"""What the surgery and AMP commands say (engine side): each message says what
happened, once, and nothing that did not happen."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch import nn

from torchmagic import Session, render
from torchmagic.core.training import amp

SETUP = """
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def run(ip, source: str) -> str:
    """Run ``source``; the text of what it displayed."""
    with capture_output() as cap:
        ip.run_cell(source).raise_error()
    return "\n".join(o.data["text/plain"] for o in cap.outputs)


def test_replace_head_without_a_class_count_says_it_is_missing(ip):
    run(ip, SETUP)
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("replace_head", "fc")
    assert str(refused.value).startswith("the class count is missing: give num_classes")
    assert "got 'fc'" not in str(refused.value)
    assert ip.user_ns["model"].fc.out_features == 1000


def test_history_after_undoing_everything_says_they_were_undone(ip):
    run(ip, SETUP)
    run(ip, "%freeze layer1-3")
    run(ip, "%unfreeze layer3 lr=1e-3")
    run(ip, "%tm undo")
    run(ip, "%tm undo")
    shown = run(ip, "%tm history")
    assert "no commands yet" not in shown
    assert shown.strip() == (
        "no commands in effect: 2 undone: %unfreeze layer3 lr=1e-3, %freeze layer1-3"
    )
    assert all(p.requires_grad for p in ip.user_ns["model"].parameters())


def test_fresh_history_says_no_commands_yet(ip):
    assert run(ip, "%tm history").strip() == "no commands yet"


def test_unfreezing_a_trainable_block_does_not_say_unfroze(ip):
    run(ip, SETUP)
    shown = run(ip, "%unfreeze layer2")
    assert "unfroze" not in shown
    assert shown.strip() == "nothing changed: layer2 already trainable in `model`"


def test_unfreezing_counts_only_what_was_frozen(resnet):
    opt = torch.optim.SGD(resnet.parameters(), lr=0.1)
    tm = Session(resnet, opt)
    tm.freeze("layer1")
    change = tm.unfreeze("layer1-2")
    assert change.effect.already == ("layer2",)
    assert change.effect.params == sum(p.numel() for p in resnet.layer1.parameters())


def test_unfreezing_trainable_blocks_into_new_groups_says_already_trainable(resnet):
    """lr= on a block that trains already moves it to its own group: not an unfreeze."""
    opt = torch.optim.SGD(resnet.parameters(), lr=0.1)
    change = Session(resnet, opt).unfreeze("layer4", lr=1e-3)
    assert not change.unchanged and change.effect.already == ("layer4",)
    title = str(render.change(change, 100)).splitlines()[0]
    assert title == "layer4 already trainable in `model`"
    assert [g.get("name") for g in opt.param_groups][-1] == "layer4"


def test_amp_off_after_bf16_mentions_no_scaler(ip, monkeypatch):
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)
    run(ip, "import torch")
    run(ip, "%amp on bf16")
    shown = run(ip, "%amp off")
    assert "GradScaler" not in shown and shown.strip() == "AMP off"


def test_amp_on_says_the_bf16_note_once(ip, monkeypatch):
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)
    shown = run(ip, "%amp on")
    assert shown.count("GradScaler") == 1 and shown.count("bf16") == 2  # head and the note


def test_no_optimizer_is_said_once(ip):
    run(ip, "import torch, torchvision\nmodel = torchvision.models.resnet18(weights=None)")
    run(ip, "%freeze layer4")
    shown = run(ip, "%unfreeze layer4")
    assert shown.count("no optimizer") == 1
    assert "no optimizer holds this model's parameters: only requires_grad changed" in shown
    shown = run(ip, "%replace_head fc 10")
    assert shown.count("no optimizer") == 1 and "create one for the new head" in shown


def test_freeze_except_titles_everything_except(ip):
    run(ip, SETUP)
    shown = run(ip, "%freeze model --except fc")
    assert shown.splitlines()[0].startswith("froze everything except fc  (11.2M params)")
    assert "(whole model)" not in shown
    model = ip.user_ns["model"]
    assert all(p.requires_grad for p in model.fc.parameters())
    assert not any(p.requires_grad for n, p in model.named_parameters() if not n.startswith("fc"))


def test_parameterless_modules_are_not_listed_as_frozen():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)
    )
    change = Session(model).freeze("0-4")
    assert change.effect.modules == ("0", "3", "4")
    carved = Session(model).freeze(exclude=["3"])  # the root carved into its children
    assert carved.unchanged  # 0 and 4 were frozen above
    model[0].weight.requires_grad_(True)
    carved = Session(model).freeze(exclude=["3"])
    assert carved.effect.modules == ("",) and carved.effect.excluded == ("3",)
    assert carved.effect.already == ("4",)


def test_freeze_after_freezing_by_hand_says_what_it_took_out_of_the_optimizer(resnet):
    """requires_grad=False by hand leaves the parameters in the optimizer; a freeze that
    only fixes that flips nothing, so its count alone ("0 params") would hide the change."""
    opt = torch.optim.SGD(resnet.parameters(), lr=0.1)
    by_hand = [p for n, p in resnet.named_parameters() if not n.startswith("fc")]
    for p in by_hand:
        p.requires_grad_(False)
    change = Session(resnet, opt).freeze(exclude=["fc"])
    assert change.effect.params == 0
    assert change.effect.resynced == sum(p.numel() for p in by_hand)
    assert [len(g["params"]) for g in opt.param_groups] == [2]
    shown = str(render.change(change, 100))
    assert shown.splitlines()[0] == "everything except fc already frozen in `model`"
    assert "11.2M params frozen by hand (requires_grad=False) were still in `optimizer`" in shown


def test_unfreeze_of_a_head_swapped_by_hand_says_it_joined_the_optimizer(resnet):
    opt = torch.optim.SGD(resnet.parameters(), lr=0.1)
    resnet.fc = nn.Linear(512, 3)  # by hand: trainable, in no group
    change = Session(resnet, opt).unfreeze("fc")
    assert change.effect.params == 0 and change.effect.resynced == 512 * 3 + 3
    assert any(p is resnet.fc.weight for g in opt.param_groups for p in g["params"])
    shown = str(render.change(change, 100))
    assert shown.splitlines()[0] == "fc already trainable in `model`"
    assert "1.54k params trainable by hand were in no group of `optimizer`: added" in shown


def test_an_ordinary_freeze_reports_no_resync(resnet):
    opt = torch.optim.SGD(resnet.parameters(), lr=0.1)
    change = Session(resnet, opt).freeze("layer1")
    assert change.effect.resynced == 0
    assert "by hand" not in str(render.change(change, 100))
