"""A script can do what a notebook can: every capability of a magic is a Session method
(devices, moves, placement, memory, estimate, doctor, AMP), without IPython."""

import pytest
import torch
from torch import nn

from torchmagic import Session, TorchMagicError


@pytest.fixture
def tm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return Session(model, optimizer)


def test_devices_set_and_move(tm):
    assert tm.device is None
    listed = tm.set_device("cpu")
    assert tm.device == torch.device("cpu") and "cpu" in {d.name for d in listed.devices}
    weight = tm.workspace.namespace["model"][0].weight
    report = tm.move()
    assert report.total_bytes == 0 and not report.left_behind  # already there
    assert tm.workspace.namespace["model"][0].weight is weight  # the same Parameter
    with pytest.raises(TorchMagicError):
        tm.set_device("warp:0")
    assert tm.device == torch.device("cpu")  # a refusal changes nothing
    assert not torch.cuda.is_initialized()


def test_check_finds_an_unregistered_tensor(tm):
    tm.workspace.namespace["model"].mask = torch.zeros(3, device="meta")
    report = tm.check()
    assert [m.name for m in report.misplaced] == ["mask"]


def test_memory_counts_the_model_and_its_state(tm):
    model, optimizer = tm.workspace.namespace["model"], tm.workspace.namespace["optimizer"]
    report = tm.memory()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.device.type == "cpu" and v.dim() > 0
    )
    assert report.params_trainable == params and report.params_frozen == 0
    assert report.optimizer_state >= state
    assert Session().memory().model_name is None  # no model: the device figures alone
    assert tm.reset_peaks().frames_dropped == 0


def test_estimate_sees_what_freeze_saves(tm):
    before = tm.estimate(input_shape=(4, 8))
    assert before.activations is not None and before.activations > 0
    tm.freeze("0")
    after = tm.estimate(optimizer_class="SGD")
    assert after.optimizer == "SGD" and after.grads < before.grads


def test_doctor_names_a_parameter_unfrozen_by_hand(tm):
    tm.freeze("0")
    assert not tm.doctor().findings
    tm.workspace.namespace["model"][0].weight.requires_grad_(True)
    subjects = " ".join(f.subject + f.message for f in tm.doctor().findings)
    assert "0.weight" in subjects


def test_amp_policy_and_one_block_autocast(tm):
    model = tm.workspace.namespace["model"].eval()
    assert not tm.amp_status().enabled
    with tm.autocast("bf16"):  # this block only: the policy stays off
        assert model(torch.randn(2, 8)).dtype is torch.bfloat16
    assert not tm.amp.enabled
    assert tm.amp_on("bf16").enabled and tm.amp.dtype is torch.bfloat16
    with tm.autocast():
        assert model(torch.randn(2, 8)).dtype is torch.bfloat16
    assert not tm.amp_off().enabled
    ran = []
    with pytest.raises(TorchMagicError), tm.autocast("fp8"):  # refused before the block
        ran.append(True)
    assert not ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA answer")
def test_pinbench_without_cuda_does_nothing(tm):
    tm.workspace.namespace["batches"] = [torch.randn(4, 8)]
    assert tm.pinbench("batches").ran is False
    assert tm.pinbench([torch.randn(4, 8)]).ran is False


def test_compiled_models_are_observed(tm):
    layer = nn.Linear(2, 2)
    compiled = tm.workspace.namespace["compiled"] = torch.compile(layer)
    tm.observe_compiled()
    layer.weight.requires_grad_(False)
    assert tm.compile_watch.changes(compiled) == [("requires_grad changed on", ["weight"])]
