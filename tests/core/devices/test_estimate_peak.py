"""The peak of a whole training step (estimate with an input shape), on the CPU.

The prediction runs on a meta-device replica; it is checked term by term against a walk
of the live tensors of a real CPU step (the same counting, on real kernels), and against
the CPU allocator's own events from the profiler.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchmagic import TorchMagicError
from torchmagic.core.devices.estimate import _LiveBytes, estimate, step_peak

SHAPE = (16, 3, 32, 32)


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def stepped(foreach: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A CNN and AdamW after one step and zero_grad: the state exists, the grads do not."""
    model = cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    model(torch.randn(SHAPE)).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def real_step_walk(model, opt, x) -> dict[str, int]:
    """Peak bytes of live tensors a real CPU step allocates, per phase."""
    tracker = _LiveBytes()
    with tracker:
        tracker.phase = "forward"
        loss = model(x).sum()
        tracker.phase = "backward"
        loss.backward()
        del loss
        tracker.phase = "step"
        before = tracker.by_kind.total()
        opt.step()
    peaks = {phase: counts.total() for phase, counts in tracker.peaks.items()}
    peaks["step"] -= before  # the step's own temporaries, on top of the gradients
    return peaks


@pytest.mark.parametrize("foreach", [False, True])
def test_peak_terms_match_a_walk_of_a_real_step(foreach):
    model, opt = stepped(foreach)
    peak = estimate(model, opt, SHAPE).peak
    measured = real_step_walk(model, opt, torch.randn(SHAPE))
    assert peak.optimizer_impl == ("foreach" if foreach else "for-loop")
    # the replica runs the same autograd formulas: the same tensors, byte for byte
    # (up to a bias gradient: 1 %)
    assert peak.forward_live == pytest.approx(measured["forward"], rel=0.01)
    backward = peak.backward_saved + peak.backward_grads + peak.activation_grads
    assert backward == pytest.approx(measured["backward"], rel=0.01)
    assert peak.optimizer_temporaries == pytest.approx(measured["step"], rel=0.01)
    # the model of the peak: persistent + the largest phase
    persistent = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    persistent += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values())
    assert peak.persistent == persistent
    assert peak.phases["backward"] == persistent + peak.input + backward
    assert peak.total == max(peak.phases.values()) and peak.phase == "backward"
    assert peak.saved_activations >= peak.backward_saved > 0


def test_peak_against_the_cpu_allocators_events():
    """The profiler reports each op's net allocation and frees between ops; integrated in
    time order it is a lower bound on the true peak (an op that allocates its output while
    its inputs are still held shows only the net). So the allocator must see at least the
    forward's live set and never more than the predicted peak (1 % for its own small
    allocations)."""
    model, opt = stepped(foreach=False)
    peak = estimate(model, opt, SHAPE).peak
    x = torch.randn(SHAPE)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    live = highest = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        highest = max(highest, live)
    predicted = peak.total - peak.persistent - peak.input
    assert peak.forward_live * 0.99 <= highest <= predicted * 1.01


def test_estimating_never_touches_the_model_or_the_rng():
    model, opt = stepped(foreach=False)
    model.add_module("drop", nn.Dropout(0.5))
    weights = [t.clone() for t in (*model.parameters(), *model.buffers())]
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    rng = torch.get_rng_state()
    estimate(model, opt, SHAPE)
    after = [*model.parameters(), *model.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))
    assert all(p.grad is None and p.device.type == "cpu" for p in model.parameters())
    assert all(torch.equal(v, state[id(p)][k]) for p, s in opt.state.items() for k, v in s.items())
    assert torch.equal(rng, torch.get_rng_state())


def test_a_lazy_model_is_refused_and_stays_lazy():
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU())
    with pytest.raises(TorchMagicError, match="lazy") as error:
        estimate(model, "AdamW", (2, 8))
    assert error.value.param == "model"
    assert isinstance(model[0], nn.LazyLinear)
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)


def test_autocast_halves_activations_and_adds_weight_copies():
    model, opt = stepped(foreach=False)
    fp32 = step_peak(model, opt, SHAPE)
    bf16 = step_peak(model, opt, SHAPE, amp_dtype=torch.bfloat16)
    assert bf16.saved_activations == pytest.approx(fp32.saved_activations / 2, rel=0.05)
    trainable = sum(p.numel() for p in model.parameters())
    assert bf16.autocast_copies == 2 * trainable and fp32.autocast_copies == 0
    assert bf16.backward_grads == pytest.approx(fp32.backward_grads, rel=0.01)  # fp32 grads


def test_workspace_allowance_only_on_cuda():
    model = cnn()
    assert step_peak(model, "SGD", SHAPE).workspace == 0
    on_gpu = step_peak(model, "SGD", SHAPE, device="cuda")  # the model stays on the CPU
    assert on_gpu.workspace > 0 and on_gpu.total > step_peak(model, "SGD", SHAPE).total


def test_optimizer_temporaries_by_implementation():
    model = cnn()
    params = sum(p.numel() * 4 for p in model.parameters())
    largest = max(p.numel() * 4 for p in model.parameters())
    foreach = step_peak(model, "AdamW", SHAPE, options={"foreach": True})
    loop = step_peak(model, "AdamW", SHAPE, options={"foreach": False})
    fused = step_peak(model, "AdamW", SHAPE, options={"fused": True})
    plain_sgd = step_peak(model, "SGD", SHAPE, options={"foreach": True})
    assert foreach.optimizer_impl == "foreach" and loop.optimizer_impl == "for-loop"
    assert foreach.optimizer_temporaries >= params  # a copy of the group at least
    # a loop over parameters holds a few temporaries of one parameter at a time
    assert largest <= loop.optimizer_temporaries <= 3 * largest
    assert fused.optimizer_impl == "fused" and fused.optimizer_temporaries == 0
    assert plain_sgd.optimizer_temporaries < params  # no momentum: nothing to copy
    assert step_peak(model, None, SHAPE).optimizer_impl == "no optimizer"
