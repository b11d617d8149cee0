"""%device engine: listing, resolving, moving a training setup, misplaced tensors, pinbench.

CPU only. The meta device stands in for a second device (tensors there have shapes but no
data); GPUs are faked (``cuda_fakes``) or hidden, so these tests mean the same on a
machine with CUDA.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from cuda_fakes import auto_device, fake_cuda, gpu, no_cuda
from snapshots import assert_same, snapshot
from torchmagic import TorchMagicError
from torchmagic.core.devices import device as dev
from torchmagic.core.devices.pinbench import pinbench
from torchmagic.core.devices.placement import find_misplaced
from torchmagic.render.device import devices, misplaced, moved, pin_report

META = torch.device("meta")


class Anchored(nn.Module):
    """A model with the classic mistake: tensors kept as plain attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
        self.anchors = torch.zeros(3)
        self.body[0].scales = [torch.ones(2), torch.ones(5)]
        self.table = {"bias": torch.zeros(4)}
        self.register_buffer("registered", torch.zeros(6), persistent=False)

    def forward(self, x):
        return self.body(x) + self.anchors


def stepped(model: nn.Module, opt_cls=torch.optim.AdamW, **kwargs):
    opt = opt_cls(model.parameters(), lr=1e-2, **kwargs)
    model(torch.randn(4, 4)).sum().backward()
    opt.step()
    return opt


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# -- listing and resolving -----------------------------------------------------------


def test_list_devices_without_gpu_names_the_cpu_and_why_no_cuda(monkeypatch):
    no_cuda(monkeypatch)
    report = dev.list_devices()
    assert [d.name for d in report.devices] == ["cpu"]
    cpu = report.devices[0]
    assert cpu.current and report.current == "cpu"
    assert cpu.total_bytes and cpu.free_bytes and cpu.free_bytes <= cpu.total_bytes
    assert any("CUDA" in note for note in report.notes)
    text = str(devices(report))
    assert "session device: cpu" in text and "no CUDA device" in text


def test_list_devices_with_faked_gpus(monkeypatch):
    """The listing logic over two fake GPUs (properties and free memory faked)."""
    fake_cuda(monkeypatch, [gpu("Fake A100", 8, 0, 108), gpu("Fake T4", 7, 5, 40)])
    report = dev.list_devices("cuda:1")
    names = [d.name for d in report.devices]
    assert names == ["cpu", "cuda:0", "cuda:1"]
    a100, t4 = report.devices[1:]
    assert a100.bf16 and not t4.bf16
    assert a100.capability == "8.0" and t4.description == "Fake T4"
    assert t4.current and not a100.current and report.current == "cuda:1"
    assert dev.list_devices().current == "cuda:0"  # auto: the first GPU


def test_a_long_device_name_gives_way_before_free_and_total(monkeypatch):
    """At a ~450 px output (900 px window, file browser open) a CPU named "Intel(R)
    Xeon(R) Processor" pushed `total` out of view: the name is hidden first (last of the
    optional columns), and free and total are key columns no width hides."""
    fake_cuda(monkeypatch, [gpu("NVIDIA GeForce RTX 4090 Laptop GPU", 8, 9, 76)])
    report = dev.list_devices("cuda:0")
    html = devices(report).html()
    assert "<th data-tm-key" in html
    assert re.findall(r"<th data-tm-key[^>]*>(.*?)</th>", html) == ["", "device", "free", "total"]
    narrow = str(devices(report, 40))
    assert "RTX 4090" not in narrow and "hidden at 40 columns: name," in narrow
    assert narrow.splitlines()[1].split() == ["┃", "device", "┃", "free", "┃", "total"]
    assert "RTX 4090" in str(devices(report, 120))  # where it fits, it is there


@pytest.mark.parametrize("spec", ["cpu", "CPU", " cpu "])
def test_resolve_cpu(spec):
    assert dev.resolve_device(spec) == torch.device("cpu")


def test_resolve_auto_is_what_this_machine_has():
    assert dev.resolve_device("auto") == auto_device()


def test_resolve_auto_without_gpus_is_the_cpu(monkeypatch):
    no_cuda(monkeypatch)
    assert dev.resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("cuda", "CUDA is not available"),
        ("cuda:1", "CUDA is not available"),
        ("mps", "MPS"),
        ("banana", "unknown device"),
        ("meta", "not a device torchmagic manages"),
    ],
)
def test_resolve_refuses_what_is_not_here(spec, words, monkeypatch):
    no_cuda(monkeypatch)
    with pytest.raises(TorchMagicError, match=words):
        dev.resolve_device(spec)


def test_resolve_cuda_index_checked_against_the_count(monkeypatch):
    fake_cuda(monkeypatch, [gpu(), gpu()])
    assert dev.resolve_device("cuda") == torch.device("cuda", 0)
    assert dev.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert dev.resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(TorchMagicError, match="2 CUDA device"):
        dev.resolve_device("cuda:2")


# -- moving --------------------------------------------------------------------------


def test_move_carries_model_optimizer_state_and_scaler_keeping_identity():
    torch.manual_seed(0)
    model = Anchored()
    opt = stepped(model)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))  # creates _scale and _growth_tracker
    params = list(model.parameters())
    group_params = [list(g["params"]) for g in opt.param_groups]
    weights = nbytes(params) + nbytes(model.buffers())
    grads = nbytes(p.grad for p in params)
    state = nbytes(
        v for s in opt.state.values() for k, v in s.items() if k != "step"
    )  # step stays on the host

    report = dev.move(model, META, opt, scaler)

    assert [p is q for p, q in zip(model.parameters(), params, strict=True)] == [True] * 6
    assert [list(g["params"]) for g in opt.param_groups] == group_params
    assert all(p.device == META and p.grad.device == META for p in params)
    assert all(b.device == META for b in model.buffers())
    for s in opt.state.values():
        assert s["exp_avg"].device == META and s["exp_avg_sq"].device == META
        assert s["step"].device.type == "cpu"
    assert scaler._scale.device == META and scaler._growth_tracker.device == META
    assert report.model_bytes == weights and report.grad_bytes == grads
    assert report.optimizer_bytes == state and report.scaler_bytes == 8
    assert report.total_bytes == weights + grads + state + 8
    left = {m.name for m in report.left_behind}
    assert left == {"anchors", "body.0.scales[0]", "body.0.scales[1]", "table['bias']"}
    opt.state_dict()  # still consistent
    text = str(moved(report))
    assert "moved `model` to meta" in text and "left behind" in text


def test_move_keeps_tied_weights_tied():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    tied = model[0].weight
    dev.move(model, META)
    assert model[0].weight is tied and model[1].weight is tied and tied.device == META


def test_move_to_where_it_is_changes_nothing(trained):
    model, opt = trained
    before = snapshot(model, opt)
    report = dev.move(model, "cpu", opt)
    assert report.total_bytes == 0 and report.tensors == 0 and not report.left_behind
    assert_same(before, snapshot(model, opt))
    assert str(moved(report)) == "`model` is already on cpu: nothing to move"


def test_move_out_of_meta_is_refused_before_anything_moves():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].to(META)
    with pytest.raises(TorchMagicError, match="to_empty"):
        dev.move(model, "cpu")
    assert model[0].weight.device.type == "cpu" and model[1].weight.device == META


def test_move_refuses_a_gpu_without_room(monkeypatch, resnet):
    """The room check runs before any tensor moves (CUDA faked: nothing reaches it)."""
    fake_cuda(monkeypatch, free=2**20, total=80 * 2**30)
    before = snapshot(resnet)
    with pytest.raises(TorchMagicError, match="MiB free"):
        dev.move(resnet, torch.device("cuda", 0))
    assert_same(before, snapshot(resnet))


# -- check ---------------------------------------------------------------------------


def test_check_healthy_models_report_nothing(trained):
    model, opt = trained
    report = find_misplaced(model, opt)
    assert report.reference == "cpu" and report.misplaced == () and report.tensors > 100
    lstm = nn.LSTM(4, 8)  # _flat_weights aliases registered parameters: not a mistake
    assert find_misplaced(lstm).misplaced == ()


def test_check_names_every_misplaced_tensor_with_its_fix():
    torch.manual_seed(0)
    model = Anchored()
    opt = stepped(model)
    model.anchors = model.anchors.to(META)
    model.body[0].scales = [torch.ones(2), torch.ones(5, device=META)]
    model.table = {"bias": torch.zeros(4, device=META)}
    model.body[1].running_mean = model.body[1].running_mean.to(META)
    fc = model.body[2].weight
    opt.state[fc]["exp_avg"] = opt.state[fc]["exp_avg"].to(META)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones((), device=META))

    report = find_misplaced(model, opt, scaler, model_name="net", optimizer_name="opt")

    found = {m.name: m for m in report.misplaced}
    assert set(found) == {
        "anchors",
        "body.0.scales[1]",
        "table['bias']",
        "body.1.running_mean",
        "opt.state[body.2.weight].exp_avg",
        "GradScaler._scale",
    }
    assert report.reference == "cpu"
    anchors = found["anchors"]
    assert (anchors.kind, anchors.device, anchors.shape, anchors.nbytes) == (
        "attribute",
        "meta",
        (3,),
        12,
    )
    assert "register_buffer('anchors', tensor, persistent=False)" in anchors.fix
    assert "register_buffer" in found["body.0.scales[1]"].fix
    assert found["body.1.running_mean"].kind == "buffer"
    assert found["opt.state[body.2.weight].exp_avg"].kind == "optimizer state"
    assert found["GradScaler._scale"].kind == "scaler"
    text = str(misplaced(report, width=160))
    assert "6 of" in text and "register_buffer" in text


def test_check_reference_is_where_most_parameter_bytes_are():
    model = nn.Sequential(nn.Linear(100, 100), nn.Linear(2, 2))
    model[1].to(META)
    report = find_misplaced(model)
    assert report.reference == "cpu"
    assert {m.name for m in report.misplaced} == {"1.weight", "1.bias"}
    assert all(m.kind == "parameter" for m in report.misplaced)


# -- pinbench ------------------------------------------------------------------------


class CountingLoader:
    pin_memory = False

    def __init__(self) -> None:
        self.iterated = 0

    def __iter__(self):
        self.iterated += 1
        yield torch.randn(2, 3)


def test_pinbench_without_cuda_says_so_and_does_nothing(monkeypatch):
    no_cuda(monkeypatch)
    loader = CountingLoader()
    report = pinbench(loader)
    assert not report.ran and "no CUDA device" in report.reason
    assert loader.iterated == 0
    assert "nothing was done" in str(pin_report(report))
