import pytest
import torch
from torch import nn

from cuda_fakes import fake_cuda
from torchmagic import TorchMagicError
from torchmagic.core.training import amp as amp_module
from torchmagic.core.training.amp import AmpController, choose_dtype


def test_policy_per_device_type(monkeypatch):
    assert choose_dtype("cpu") is torch.bfloat16
    with pytest.raises(TorchMagicError, match="use bf16 instead"):
        choose_dtype("cpu", "fp16")
    fake_cuda(monkeypatch)  # an A100: bf16
    assert choose_dtype("cuda") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert choose_dtype("cuda") is torch.float16  # e.g. a T4 or V100
    with pytest.raises(TorchMagicError, match="no bf16 support"):
        choose_dtype("cuda", "bf16")
    with pytest.raises(TorchMagicError, match="unknown precision"):
        choose_dtype("cpu", "fp8")


def test_bf16_needs_no_scaler(monkeypatch):
    monkeypatch.setattr(amp_module, "cpu_has_native_bf16", lambda: True)
    amp = AmpController()
    status = amp.turn_on("cpu")
    assert status.enabled and status.dtype == "bf16" and not status.scaler
    assert amp.scaler is None and not status.note  # the render says "no GradScaler" once


def test_scaler_state_survives_off_and_on(monkeypatch):
    fake_cuda(monkeypatch)
    amp = AmpController()
    amp.turn_on("cuda", "fp16")
    first = amp.scaler
    assert isinstance(first, torch.amp.GradScaler) and first.is_enabled()
    state = first.state_dict()
    state["scale"] = 1024.0
    state["_growth_tracker"] = 7
    first.load_state_dict(state)
    amp.turn_off()
    assert amp.scaler is None and not amp.enabled
    status = amp.turn_on("cuda", "fp16")
    assert amp.scaler is not first
    assert amp.scaler.get_scale() == 1024.0 and status.scale == 1024.0
    assert amp.scaler.state_dict()["_growth_tracker"] == 7


def test_autocast_covers_forward_only():
    amp = AmpController()
    amp.turn_on("cpu", "bf16")
    layer = nn.Linear(4, 4)
    with amp.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype is torch.bfloat16
    assert layer(torch.randn(2, 4)).dtype is torch.float32  # nothing leaks outside
    amp.turn_off()
    with amp.autocast():
        assert layer(torch.randn(2, 4)).dtype is torch.float32


def test_step_with_a_scaler_matches_plain_step():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 2), nn.Linear(4, 2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 4)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
    amp = AmpController()
    amp.enabled, amp.scaler = True, torch.amp.GradScaler("cpu", init_scale=256.0)
    assert amp.step(a(x).pow(2).mean(), opt_a)
    b(x).pow(2).mean().backward()
    opt_b.step()
    assert torch.allclose(a.weight, b.weight) and a.weight.grad is None  # unscaled, zeroed


def test_step_skips_the_scaler_when_nothing_in_the_optimizer_trains():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
    model[1].requires_grad_(False)
    amp = AmpController()
    amp.enabled, amp.scaler = True, torch.amp.GradScaler("cpu")
    before = model[1].weight.clone()
    assert amp.step(model(torch.randn(3, 4)).sum(), opt) is False
    assert torch.equal(model[1].weight, before)
