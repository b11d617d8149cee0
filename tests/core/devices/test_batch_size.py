"""find_batch_size on the CPU: against a memory budget, leaving every bit of state as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchmagic import TorchMagicError, render
from torchmagic.core.devices.batch_size import find_batch_size
from torchmagic.core.devices.estimate import _LiveBytes

SAMPLE = (3, 16, 16)
MiB = 2**20


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Flatten(),
        nn.Linear(8 * 16 * 16, 5),
    )


def trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, *SAMPLE)).sum().backward()
    opt.step()  # state exists and the gradients stay: both must survive
    return model, opt


def persistent(model, opt) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for s in opt.state.values() for v in s.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


def test_state_is_bit_identical_afterwards():
    model, opt = trained()
    weights = [t.clone() for t in (*model.parameters(), *model.buffers())]
    grads = [p.grad.clone() for p in model.parameters()]
    state_objects = {id(p): dict(s) for p, s in opt.state.items()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    rng = torch.get_rng_state()
    report = find_batch_size(model, opt, SAMPLE, budget=persistent(model, opt) + 8 * MiB)
    assert report.batch > 0 and len(report.points) == 3
    after = [*model.parameters(), *model.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    for p, s in opt.state.items():
        assert s.keys() == state[id(p)].keys()
        for key, value in s.items():
            assert value is state_objects[id(p)][key]  # the same tensors, restored in place
            assert torch.equal(value, state[id(p)][key])
    assert torch.equal(rng, torch.get_rng_state())


def test_answer_grows_with_the_budget():
    model, opt = trained()
    base = persistent(model, opt)
    answers = [
        find_batch_size(model, opt, SAMPLE, budget=base + mib * MiB).batch for mib in (1, 2, 4, 8)
    ]
    assert answers == sorted(answers) and answers[0] < answers[-1]


def brute_force(model, opt, budget: int, upto: int) -> int:
    """The largest batch whose real step (live tensors counted) fits the budget."""
    fits = 0
    base = persistent(model, opt)
    for batch in range(1, upto + 1):
        tracker = _LiveBytes()
        x = torch.randn(batch, *SAMPLE)
        with tracker:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if base + max(c.total() for c in tracker.peaks.values()) <= budget:
            fits = batch
    return fits


@pytest.mark.slow
def test_answer_within_a_few_percent_of_brute_force():
    model, opt = trained()
    budget = persistent(model, opt) + 3 * MiB
    report = find_batch_size(model, opt, SAMPLE, budget=budget)
    opt.zero_grad(set_to_none=True)
    truth = brute_force(model, opt, budget, upto=report.batch + 10)
    # the line is fitted on real steps; BatchNorm's per-channel temporaries and the
    # optimizer's first-step allocations make it slightly conservative at most
    assert truth * 0.9 <= report.batch <= truth
    assert report.per_sample_bytes > 0 and report.seconds > 0
    assert report.confirmed_bytes is not None and report.confirmed_bytes <= report.capacity


def test_max_batch_caps_and_bad_input_is_refused():
    model, opt = trained()
    report = find_batch_size(model, opt, SAMPLE, budget=2**40, max_batch=12)
    assert report.batch == 12 and report.capped
    with pytest.raises(TorchMagicError) as error:
        find_batch_size(model, opt, (0, 16, 16))
    assert error.value.param == "input_shape"
    with pytest.raises(TorchMagicError) as error:
        find_batch_size(model, opt, SAMPLE, max_batch=0)
    assert error.value.param == "max_batch"


def test_a_budget_below_what_is_held_fits_nothing():
    model, opt = trained()
    assert find_batch_size(model, opt, SAMPLE, budget=1024).batch == 0


def step_bound() -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small conv net with a wide head under foreach AdamW: at batches 2 to 8 the
    optimizer step (gradients plus temporaries, the same at every batch) is the step's
    peak, so the peaks alone make a flat line; the backward still grows with the batch."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 16 * 16, 256),
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)


def test_a_step_bound_peak_still_grows_with_the_budget_and_agrees_with_its_table():
    model, opt = step_bound()
    base = persistent(model, opt)
    reports = [
        find_batch_size(model, opt, SAMPLE, budget=base + mib * MiB) for mib in (16, 32, 64, 128)
    ]
    first = reports[0].points
    assert first[0].step_bytes == first[-1].step_bytes  # the peaks alone: flat
    assert first[0].phases[1] < first[-1].phases[1]  # the backward grows
    answers = [r.batch for r in reports]
    assert answers[0] > 0 and all(a < b for a, b in zip(answers, answers[1:], strict=False))
    for r in reports:
        assert r.phase in ("forward", "backward") and r.per_sample_bytes > 0
        assert r.fixed_bytes + r.per_sample_bytes * r.batch <= r.capacity  # the line says fits
        assert r.confirmed_bytes is not None and r.confirmed_bytes <= r.capacity
        assert all(p.step_bytes <= r.capacity for p in r.points if p.batch <= r.batch)
        text = str(render.render(r))
        assert f"largest batch on cpu: {r.batch}" in text and "not even" not in text


def test_nothing_fits_when_the_flat_optimizer_step_alone_is_over_the_budget():
    model, opt = step_bound()
    report = find_batch_size(model, opt, SAMPLE, budget=persistent(model, opt) + 2 * MiB)
    step = report.points[0].phases[2]
    assert step > report.capacity and report.batch == 0  # the step phase alone is too big
    assert report.fixed_bytes + report.per_sample_bytes > report.capacity  # named truly
    text = str(render.render(report))
    assert f"not even a batch of 1 fits on cpu: the {report.phase} needs" in text
