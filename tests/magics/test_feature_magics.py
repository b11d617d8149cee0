"""The magics over engine features added since the split: %device compare, %gpumem batch,
%load_model, %fit --sched-step and %replace_head labels= — each one Session call, each
bad line one UsageError that changes nothing."""

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import torchmagic
from cuda_fakes import no_cuda

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
batches = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(4)]
"""


def shown(ip, line: str) -> str:
    with capture_output() as cap:
        ip.run_cell(line).raise_error()
    assert cap.outputs and all("text/html" in o.data for o in cap.outputs)
    return "\n".join(o.data["text/plain"] for o in cap.outputs)


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def test_device_compare_times_copies_and_leaves_the_model(ip, monkeypatch):
    no_cuda(monkeypatch)
    ip.run_cell(SETUP).raise_error()
    before = weights(ip.user_ns["model"])
    text = shown(ip, "%device compare batches --steps 2")
    assert "cpu" in text
    after = weights(ip.user_ns["model"])
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not ip.user_ns["optimizer"].state  # the live optimizer never stepped
    with pytest.raises(UsageError, match="--steps"):
        ip.run_line_magic("device", "compare batches --steps 0")


def test_gpumem_batch_answers_against_a_budget(ip):
    ip.run_cell(SETUP).raise_error()
    before = weights(ip.user_ns["model"])
    text = shown(ip, "%gpumem batch --input-shape 8 --budget 64MiB --max 256")
    assert "largest batch" in text
    after = weights(ip.user_ns["model"])
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    with pytest.raises(UsageError, match="--input-shape"):
        ip.run_line_magic("gpumem", "batch")
    with pytest.raises(UsageError, match="--budget"):
        ip.run_line_magic("gpumem", "batch --input-shape 8 --budget lots")


def test_load_model_binds_weights_preprocess_categories_and_replaces_the_head(ip):
    text = shown(ip, "%load_model resnet18 --weights none --num-classes 7")
    model = ip.user_ns["model"]
    assert model.fc.out_features == 7
    assert ip.user_ns["weights"] is None and ip.user_ns["categories"] is None
    assert "random weights" in text
    session = torchmagic.notebook_session()
    assert [e.action for e in session.history()] == ["replace_head"]
    assert "%replace_head model 7" in shown(ip, "%tm history")  # the magic, not a Python call
    session.undo()
    assert model.fc.out_features == 1000
    with pytest.raises(UsageError, match="no_such_net"):
        ip.run_line_magic("load_model", "no_such_net --weights none")


def test_fit_sched_step_overrides_every_scheduler(ip):
    ip.run_cell(SETUP).raise_error()
    ip.run_cell(
        "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)"
    ).raise_error()
    with capture_output():
        ip.run_line_magic("fit", "batches --sched-step batch --epochs 1")
    assert ip.user_ns["scheduler"].last_epoch == 4  # four batches, stepped per batch
    with pytest.raises(UsageError):
        ip.run_line_magic("fit", "batches --sched-step hourly")


def test_replace_head_takes_labels_or_says_the_count_is_missing(ip):
    ip.run_cell(SETUP).raise_error()
    with pytest.raises(UsageError, match="the class count is missing"):
        ip.run_line_magic("replace_head", "model.3")
    assert ip.user_ns["model"][3].out_features == 3
    with capture_output():  # a plain Sequential takes names too: the session keeps them
        ip.run_line_magic("replace_head", "auto labels=a,b")
    assert ip.user_ns["model"][3].out_features == 2
    with capture_output():
        ip.run_line_magic("replace_head", "auto 5")
    assert ip.user_ns["model"][3].out_features == 5


RECIPE_SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential()
model.add_module("body", nn.Sequential(nn.Linear(8, 16), nn.ReLU()))
model.add_module("mid", nn.Sequential(nn.Linear(16, 16), nn.ReLU()))
model.add_module("fc", nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
batches = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(3)]
"""


def test_lr_find_restores_everything_and_applies_as_one_undoable_entry(ip):
    ip.run_cell(RECIPE_SETUP).raise_error()
    model, opt = ip.user_ns["model"], ip.user_ns["optimizer"]
    before = weights(model)
    with capture_output():
        shown = ip.run_line_magic("lr_find", "batches --steps 12 --end 1")
    assert len(shown.result.lrs) >= 2 and "<svg" in shown._repr_mimebundle_()["text/html"]
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model), strict=True))
    assert opt.param_groups[0]["lr"] == 0.05 and not opt.state
    with pytest.raises(UsageError, match="--start"):
        ip.run_line_magic("lr_find", "batches --start 10 --end 1")


def test_fit_unfreezes_progressively_through_the_history(ip):
    ip.run_cell(RECIPE_SETUP).raise_error()
    with capture_output():
        ip.run_line_magic("freeze", "model --except fc")
        ip.run_line_magic("fit", "batches --val batches --epochs 3 --unfreeze mid,body --every 1")
    history = torchmagic.notebook_session().fits[-1]
    assert [u.block for u in history.unfreezes] == ["mid", "body"]
    model = ip.user_ns["model"]
    assert all(p.requires_grad for p in model.parameters())
    actions = [e.action for e in torchmagic.notebook_session().history()]
    assert actions == ["freeze", "unfreeze", "unfreeze"]
    with pytest.raises(UsageError, match="--every"):
        ip.run_line_magic("fit", "batches --unfreeze mid --every 0")


def test_fine_tune_is_its_four_commands(ip):
    ip.run_cell(RECIPE_SETUP).raise_error()
    with capture_output():
        ip.run_line_magic("fine_tune", "batches --val batches --epochs 1 --lr 0.01")
    actions = [e.action for e in torchmagic.notebook_session().history()]
    assert actions == ["freeze", "unfreeze"]
    assert len(torchmagic.notebook_session().fits) == 2
    with pytest.raises(UsageError):
        ip.run_line_magic("fine_tune", "batches --epochs 1")  # --val is required
