"""device compare engine: copies are timed, the live model, optimizer and random state
are left bit for bit as they were; without an accelerator the report says so."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchmagic.core.devices import compare as compare_mod
from torchmagic.core.devices.compare import compare, first_batch, replicate
from torchmagic.core.errors import TorchMagicError


def make_setup():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 3),
    )
    opt = torch.optim.AdamW(
        [
            {"params": model[0].parameters(), "lr": 1e-4},
            {"params": [*model[1].parameters(), *model[5].parameters()], "weight_decay": 0.0},
        ],
        lr=1e-3,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # wraps opt.step
    data = TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 3, (16,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()  # state to copy
    return model, opt, sched, loader


def snapshot(model, opt):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [(p.grad.clone() if p.grad is not None else None) for p in model.parameters()],
        {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()},
        [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        [list(g["params"]) for g in opt.param_groups],
        model.training,
    )


def same(a, b):
    sd_a, grads_a, state_a, groups_a, params_a, mode_a = a
    sd_b, grads_b, state_b, groups_b, params_b, mode_b = b
    assert sd_a.keys() == sd_b.keys()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert all(
        (x is None and y is None) or torch.equal(x, y)
        for x, y in zip(grads_a, grads_b, strict=True)
    )
    assert state_a.keys() == state_b.keys()
    for pid in state_a:
        assert all(torch.equal(state_a[pid][k], state_b[pid][k]) for k in state_a[pid])
    assert groups_a == groups_b and mode_a == mode_b
    assert all(
        x is y
        for ga, gb in zip(params_a, params_b, strict=True)
        for x, y in zip(ga, gb, strict=True)
    )


def test_live_objects_and_random_state_are_untouched():
    model, opt, sched, loader = make_setup()
    model.eval()
    opt._opt_called = False  # set by the setup's step; a scheduler-wrapped step sets it
    before = snapshot(model, opt)
    rng, py = torch.get_rng_state(), random.getstate()
    report = compare(model, loader, opt, steps=2, warmup=1, model_name="model")
    same(before, snapshot(model, opt))
    assert torch.equal(rng, torch.get_rng_state()) and random.getstate() == py
    assert sched.last_epoch == 0 and not getattr(opt, "_opt_called", False)
    (cpu,) = [t for t in report.timings if t.device == "cpu"]
    assert cpu.timed and cpu.step_ms > 0 and cpu.copy_ms >= 0 and cpu.samples_per_s > 0
    assert report.batch_size == 8 and report.optimizer == "AdamW" and report.steps == 2


def test_the_copies_really_train():
    model, opt, _, _ = make_setup()
    replica, fresh = replicate(model, opt, torch.device("cpu"))
    assert type(fresh) is torch.optim.AdamW and fresh is not opt
    assert [g["lr"] for g in fresh.param_groups] == [1e-4, 1e-3]
    assert [g["weight_decay"] for g in fresh.param_groups] == [0.01, 0.0]
    live_ids = {id(p) for p in model.parameters()}
    assert not any(id(p) in live_ids for g in fresh.param_groups for p in g["params"])
    first = next(iter(fresh.state.values()))
    live_first = next(iter(opt.state.values()))
    assert torch.equal(first["exp_avg"], live_first["exp_avg"])
    assert first["exp_avg"].data_ptr() != live_first["exp_avg"].data_ptr()
    weight = replica[5].weight.detach().clone()
    replica(torch.randn(2, 3, 8, 8)).sum().backward()
    fresh.step()
    assert not torch.equal(weight, replica[5].weight)


def test_without_an_accelerator_the_report_says_cpu_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(compare_mod, "_mps_available", lambda: False)
    model, opt, _, loader = make_setup()
    report = compare(model, loader, opt, steps=1, warmup=0)
    assert report.cpu_only and report.accelerators == ()
    assert [t.device for t in report.timings] == ["cpu"]
    assert "no CUDA device" in report.no_accelerator
    assert report.fastest == "cpu" and report.speedup == 1.0 and report.runner_up == ""


def test_a_batch_and_no_optimizer():
    model, _, _, _ = make_setup()
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,)))
    report = compare(model, batch, None, steps=1, warmup=0)
    assert report.batch_size == 4 and report.optimizer.startswith("SGD")


def test_ranking_from_numbers():
    report = compare_mod.CompareReport(
        "m",
        8,
        0,
        3,
        1,
        "SGD",
        (
            compare_mod.DeviceTiming("cpu", 30.0, 0.0, 266.0),
            compare_mod.DeviceTiming("cuda:0", 10.0, 2.0, 800.0),
            compare_mod.DeviceTiming("cuda:1", skipped="out of memory"),
        ),
        ("cuda:0", "cuda:1"),
        "",
    )
    assert report.fastest == "cuda:0" and report.runner_up == "cpu"
    assert report.speedup == pytest.approx(3.0) and not report.cpu_only


def test_one_shot_iterators_are_refused_untouched():
    batches = iter([(torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))])
    with pytest.raises(TorchMagicError, match="one-shot iterator") as info:
        first_batch(batches)
    assert info.value.param == "source"
    assert next(batches)[1].tolist() == [0, 1]  # still there
    with pytest.raises(TorchMagicError, match="steps must be at least 1"):
        compare(nn.Linear(2, 2), (torch.randn(2, 2), torch.tensor([0, 1])), steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_is_timed_and_live_cpu_model_untouched():
    model, opt, _, loader = make_setup()
    before = snapshot(model, opt)
    cuda_rng = torch.cuda.get_rng_state_all()
    report = compare(model, loader, opt, steps=3, warmup=2)
    same(before, snapshot(model, opt))
    assert all(
        torch.equal(a, b) for a, b in zip(cuda_rng, torch.cuda.get_rng_state_all(), strict=True)
    )
    devices = [t.device for t in report.timings]
    assert devices[0] == "cpu" and "cuda:0" in devices and not report.cpu_only
    assert all(t.timed and t.step_ms > 0 for t in report.timings)
    assert report.timings[1].copy_ms > 0 and report.fastest in devices


def test_rendered_verdict():
    from torchmagic.render.compare import device_compare

    report = compare_mod.CompareReport(
        "model",
        8,
        1024,
        3,
        1,
        "AdamW",
        (
            compare_mod.DeviceTiming("cpu", 30.0, 0.0, 266.0),
            compare_mod.DeviceTiming("cuda:0", 10.0, 2.0, 800.0),
        ),
        ("cuda:0",),
        "",
    )
    bundle = device_compare(report)._repr_mimebundle_()
    assert "cuda:0 is 3.0x faster than cpu" in bundle["text/plain"]
    assert "CPU only" not in bundle["text/plain"] and "<pre" in bundle["text/html"]


def test_labels_beyond_the_head_are_one_clear_refusal() -> None:
    from torch import nn

    from torchmagic import TorchMagicError
    from torchmagic.core.devices.compare import compare

    model = nn.Sequential(nn.Linear(4, 3))
    batch = (torch.randn(8, 4), torch.full((8,), 7))  # class 7 of a 3-output head
    before = [t.clone() for t in model.state_dict().values()]
    with pytest.raises(TorchMagicError, match="labels beyond the head") as refused:
        compare(model, batch, steps=1, warmup=0, devices=["cpu"])
    assert refused.value.param == "loader"
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values(), strict=True))
