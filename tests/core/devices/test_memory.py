"""%gpumem engine on the CPU: the breakdown, peaks and tracebacks, the per-cell watcher,
and the estimate against the bytes a real step allocates (walking the tensors)."""

from __future__ import annotations

import gc
import mmap
import sys
import weakref

import pytest
import torch
from torch import nn

from cuda_fakes import no_cuda
from torchmagic import Session, TorchMagicError
from torchmagic.core import tensors
from torchmagic.core.devices import memory
from torchmagic.core.devices.estimate import estimate, saved_activation_bytes
from torchmagic.render.memory import cell_line
from torchmagic.render.memory import estimate as render_estimate
from torchmagic.render.memory import memory as render_memory
from torchmagic.render.memory import reset as render_reset


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4)
    )


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()


def held(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Weights + gradients + optimizer state, walking the tensors (what the estimate
    predicts)."""
    report = memory.breakdown(model, opt)
    return report.params_trainable + report.params_frozen + report.grads + report.optimizer_state


# -- breakdown -----------------------------------------------------------------------


def test_breakdown_counts_each_role_once(trained):
    model, opt = trained
    Session(model, opt).freeze("layer1-3")
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    report = memory.breakdown(model, opt, model_name="model")
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert report.params_trainable == nbytes(trainable)
    assert report.params_frozen == nbytes(frozen)
    assert report.grads == nbytes(trainable)
    assert report.optimizer_state == nbytes(v for p in trainable for v in opt.state[p].values())
    assert report.buffers == nbytes(model.buffers())
    assert report.device == "cpu" and report.source == "process RSS"
    assert report.in_use > report.tensors and report.rest == report.in_use - report.tensors
    assert report.peak >= report.in_use and report.total >= report.free > 0
    text = str(render_memory(report))
    assert "optimizer state" in text and "process RSS" in text


def test_breakdown_counts_tied_weights_once():
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 100, bias=False))
    model[1].weight = model[0].weight
    assert memory.breakdown(model).params_trainable == 100 * 8 * 4


def test_breakdown_without_model_and_with_tensors_elsewhere(monkeypatch):
    no_cuda(monkeypatch)  # else the device CUDA is in use on, once something initialised it
    assert memory.breakdown(None).device == "cpu"
    model = nn.Sequential(nn.Linear(100, 100), nn.Linear(10, 10))
    model[1].to("meta")
    report = memory.breakdown(model)
    assert report.params_trainable == (100 * 100 + 100) * 4
    assert report.elsewhere == (10 * 10 + 10) * 4


def _fail_holding(tensor_bytes: int):
    batch = torch.ones(tensor_bytes // 4)  # noqa: F841  (the local the traceback pins)
    raise RuntimeError("out of memory, say")


def test_traceback_pins_tensors_until_reset_drops_it(monkeypatch):
    try:
        _fail_holding(4 * 2**20)
    except RuntimeError as error:
        tb = error.__traceback__
    monkeypatch.setattr(sys, "last_traceback", tb, raising=False)
    monkeypatch.setattr(sys, "last_value", None, raising=False)
    del tb
    report = memory.breakdown(None)
    assert report.traceback_frames == 2 and report.traceback_bytes == 4 * 2**20
    assert "%gpumem reset --tracebacks" in str(render_memory(report))
    pinned = weakref.ref(sys.last_traceback.tb_next.tb_frame.f_locals["batch"])
    reset = memory.reset_peaks(drop_tracebacks=True)
    assert reset.frames_dropped == 2 and reset.released_bytes == 4 * 2**20
    assert sys.last_traceback is None and pinned() is None
    assert memory.breakdown(None).traceback_frames == 0
    assert "dropped the last traceback" in str(render_reset(reset))


def test_reset_peaks_without_gpu_resets_the_process_peak(monkeypatch):
    no_cuda(monkeypatch)
    reset = memory.reset_peaks()
    assert not any(p.startswith("cuda") for p in reset.peaks)
    if sys.platform.startswith("linux"):
        assert reset.peaks == ("cpu",)
    assert reset.frames_dropped == 0


def test_cell_watcher_measures_a_cell(monkeypatch):
    no_cuda(monkeypatch)  # the CPU path, also where CUDA is in use
    watcher = memory.CellWatcher()
    assert watcher.post() is None  # no pre: nothing to say
    gc.collect()  # earlier tests' garbage must not be freed inside the "cell"
    watcher.pre()
    # 256 MiB of fresh pages, each touched: an allocator may hand back memory an earlier
    # test freed but kept resident, which would not grow the process at all
    kept = mmap.mmap(-1, 256 * 2**20)
    for offset in range(0, len(kept), mmap.PAGESIZE):
        kept[offset] = 1
    cell = watcher.post()
    assert cell.device == "cpu" and cell.delta > 128 * 2**20
    if cell.peak is not None:
        assert cell.peak >= cell.after
    assert cell_line(cell).startswith("[cpu] +") and "MiB" in cell_line(cell)
    assert watcher.post() is None  # one result per pre
    kept.close()


# -- estimate ------------------------------------------------------------------------


OPTIMIZERS = [
    (torch.optim.AdamW, {}),
    (torch.optim.Adam, {"amsgrad": True}),
    (torch.optim.NAdam, {}),
    (torch.optim.RAdam, {}),
    (torch.optim.Adamax, {}),
    (torch.optim.Adadelta, {}),
    (torch.optim.Adagrad, {}),
    (torch.optim.RMSprop, {}),
    (torch.optim.RMSprop, {"momentum": 0.9, "centered": True}),
    (torch.optim.SGD, {}),
    (torch.optim.SGD, {"momentum": 0.9}),
    (torch.optim.Rprop, {}),
    (torch.optim.ASGD, {}),
]


@pytest.mark.parametrize(("cls", "kwargs"), OPTIMIZERS, ids=lambda v: getattr(v, "__name__", v))
def test_estimate_matches_one_real_step_exactly(cls, kwargs):
    """Frozen first layer via torchmagic; the estimate, made before any step, equals what
    the step then holds (weights + gradients + state), by optimizer class and group."""
    model = small()
    opt = cls(model.parameters(), lr=1e-3, **kwargs)
    Session(model, opt).freeze("0")
    predicted = estimate(model, opt)
    step(model, opt)
    assert predicted.weights + predicted.grads + predicted.optimizer_state == held(model, opt)


@pytest.mark.parametrize(("cls", "kwargs"), OPTIMIZERS, ids=lambda v: getattr(v, "__name__", v))
def test_estimate_by_class_name_matches_an_optimizer_over_trainable_params(cls, kwargs):
    model = small()
    for p in model[0].parameters():
        p.requires_grad_(False)
    predicted = estimate(model, cls.__name__, options=kwargs)
    opt = cls([p for p in model.parameters() if p.requires_grad], lr=1e-3, **kwargs)
    step(model, opt)
    assert predicted.optimizer == cls.__name__
    assert predicted.weights + predicted.grads + predicted.optimizer_state == held(model, opt)


def test_freeze_saving_is_visible_before_running():
    model = small()
    opt = torch.optim.AdamW(model.parameters())
    before = estimate(model, opt)
    Session(model, opt).freeze("0-1")
    after = estimate(model, opt)
    frozen = nbytes(list(model[0].parameters()) + list(model[1].parameters()))
    assert before.grads - after.grads == frozen
    assert before.optimizer_state - after.optimizer_state == 2 * frozen + 4 * 4  # 4 steps
    assert after.freeze_saving == frozen + 2 * frozen + 4 * 4
    text = str(render_estimate(after))
    assert "freezing them saves" in text and "2 per trainable parameter" in text


def test_naive_freeze_keeps_idle_state_and_stale_grads():
    """requires_grad only, after a step: the state stays (idle); zero (not None) grads
    stay allocated and make the next step update the frozen parameters' state too."""
    model = small()
    opt = torch.optim.AdamW(model.parameters())
    step(model, opt)
    for p in model[0].parameters():
        p.requires_grad_(False)
    first = nbytes(model[0].parameters())
    opt.zero_grad()  # set_to_none: the frozen parameters get no gradient any more
    est = estimate(model, opt)
    assert est.idle_state == 2 * first + 2 * 4
    step(model, opt)
    assert est.weights + est.grads + est.optimizer_state == held(model, opt)

    model = small()
    opt = torch.optim.AdamW(model.parameters())
    step(model, opt)
    for p in model[0].parameters():
        p.requires_grad_(False)
    opt.zero_grad(set_to_none=False)  # zeros: the frozen parameters keep a gradient
    est = estimate(model, opt)
    assert est.grads == nbytes(model.parameters())
    assert est.idle_state == 0  # their state is live again: the step updates them
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    assert est.weights + est.grads + est.optimizer_state == held(model, opt)


class OneBuffer(torch.optim.Optimizer):
    """An optimizer torchmagic has no rule for: one buffer per parameter."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("buf", torch.zeros_like(p))
                buf.add_(p.grad)
                p.sub_(group["lr"] * buf)


def test_unknown_optimizer_is_unknown_until_it_has_state():
    model = small()
    opt = OneBuffer(model.parameters())
    est = estimate(model, opt)
    assert est.optimizer_state is None and "unknown" in est.state_rule
    assert est.freeze_saving is None
    assert "unknown" in str(render_estimate(est))
    step(model, opt)
    est = estimate(model, opt)
    assert "measured" in est.state_rule
    assert est.optimizer_state == tensors.state_bytes(opt)


def test_estimate_refuses_what_is_not_an_optimizer():
    with pytest.raises(TorchMagicError, match="not a torch.optim optimizer"):
        estimate(small(), "Adamm")
    with pytest.raises(TorchMagicError, match="expected an optimizer"):
        estimate(small(), 3)


# -- activations ---------------------------------------------------------------------


def test_saved_activations_of_a_small_mlp():
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    # ReLU saves its output, the second Linear saves the same tensor: 4×20 floats once;
    # the input and the weights are not activations
    assert saved_activation_bytes(model, (4, 10)) == 4 * 20 * 4
    for p in model.parameters():
        p.requires_grad_(False)
    assert saved_activation_bytes(model, (4, 10)) == 0  # nothing to backpropagate


def test_activation_pass_leaves_no_trace():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    stats = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    est = estimate(model, "AdamW", input_shape=(16, 8))
    assert est.activations > 0 and est.input_shape == (16, 8)
    assert all(torch.equal(a, b) for a, b in zip(stats, model.buffers(), strict=True))
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())
    assert "saved for backward" in str(render_estimate(est))


def test_activation_pass_with_a_wrong_shape_is_refused():
    with pytest.raises(TorchMagicError, match=r"shape \(2, 3\) failed"):
        saved_activation_bytes(small(), (2, 3))
    with pytest.raises(TorchMagicError, match="positive"):
        saved_activation_bytes(small(), (0, 16))


def test_cell_watcher_stop_forgets_the_cell_being_watched(monkeypatch):
    no_cuda(monkeypatch)
    watcher = memory.CellWatcher()
    watcher.pre()
    watcher.stop()
    assert watcher.post() is None
    watcher.pre()  # watching again: the next cell is measured
    assert watcher.post() is not None
