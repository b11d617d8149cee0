"""Notebook habits: loss functions and transforms in the namespace, variables
bound to a model's blocks, commands run twice, undo, AMP before a model exists and on a
CPU without bf16 instructions, and the bytes a traceback holds."""

from __future__ import annotations

import sys

import pytest
import torch
import torchvision
from IPython.utils.capture import capture_output
from torch import nn

import torchmagic
from torchmagic import Session
from torchmagic.core.devices import memory
from torchmagic.core.training import amp

SETUP = """
import torch, torchvision
from torch import nn
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def run(ip, source: str):
    result = ip.run_cell(source)
    result.raise_error()
    return result.result


def text_of(cap) -> str:
    return "\n".join(o.data["text/plain"] for o in cap.outputs)


def held(opt: torch.optim.Optimizer) -> set[int]:
    return {id(p) for g in opt.param_groups for p in g["params"]}


@pytest.fixture
def bf16_native(monkeypatch):
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)


@pytest.fixture
def bf16_emulated(monkeypatch):
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: False)


# -- the namespace ---------------------------------------------------------------------


def test_a_loss_function_and_transforms_are_never_model_candidates(resnet):
    tm = Session(
        namespace={
            "model": resnet,
            "criterion": nn.CrossEntropyLoss(),
            "normalize": torchvision.transforms.Normalize((0.5,), (0.5,)),
            "augment": torchvision.transforms.RandomHorizontalFlip(),
        }
    )
    assert list(tm.workspace.models()) == ["model"]
    change = tm.freeze("layer1")  # no "which model?" between model and criterion
    assert change.model_name == "model"
    assert not any(p.requires_grad for p in resnet.layer1.parameters())


def test_a_variable_bound_to_a_block_acts_on_its_model(ip):
    run(ip, SETUP + "layer4 = model.layer4\n")
    ns = ip.user_ns
    with capture_output():
        run(ip, "%freeze layer4")
    model, opt = ns["model"], ns["optimizer"]
    layer4 = {id(p) for p in model.layer4.parameters()}
    assert not any(p.requires_grad for p in model.layer4.parameters())
    assert not layer4 & held(opt)  # model's optimizer edited
    session = torchmagic.notebook_session()
    assert session.workspace.current == "model"
    [entry] = session.history()
    assert entry.model_name == "model" and entry.modules == ("layer4",)
    with capture_output():
        run(ip, "%unfreeze layer4.1 lr=1e-3")
    group = next(g for g in opt.param_groups if g.get("name") == "layer4.1")
    assert {id(p) for p in group["params"]} == {id(p) for p in model.layer4[1].parameters()}
    assert session.summary("layer4").model_name == "model.layer4"


def test_a_block_variable_in_except_and_a_glob_under_it(resnet):
    ns = {"model": resnet, "head": resnet.fc, "block": resnet.layer4[0]}
    tm = Session(namespace=ns)
    change = tm.freeze("model", exclude=["head"])
    assert change.effect.excluded == ("fc",)
    assert all(p.requires_grad for p in resnet.fc.parameters())
    tm.unfreeze("block.bn*")
    assert resnet.layer4[0].bn1.weight.requires_grad
    assert not resnet.layer4[0].conv1.weight.requires_grad


# -- commands that change nothing, and undo ----------------------------------------------


def test_freezing_twice_says_so_and_records_nothing(ip):
    run(ip, SETUP)
    with capture_output() as cap:
        run(ip, "%freeze model.layer1-3")
        run(ip, "%freeze model.layer1-3")
    again = cap.outputs[1].data["text/plain"]
    assert again.strip() == "nothing changed: layer1, layer2, layer3 already frozen in `model`"
    session = torchmagic.notebook_session()
    assert [e.command for e in session.history()] == ["%freeze model.layer1-3"]
    with capture_output() as cap:
        run(ip, "%tm undo")
    assert text_of(cap).splitlines()[0].startswith("undid: %freeze model.layer1-3")
    assert all(p.requires_grad for p in ip.user_ns["model"].layer1.parameters())


def test_a_no_op_keeps_the_state_exactly(trained):
    """The no-op's transaction is reverted: gradients of frozen parameters stay too."""
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1")
    grad = torch.ones_like(model.layer1[0].conv1.weight)
    model.layer1[0].conv1.weight.grad = grad
    change = tm.freeze("layer1")
    assert change.unchanged and len(tm.history()) == 1
    assert model.layer1[0].conv1.weight.grad is grad


def test_a_dry_run_of_a_no_op_is_still_unchanged(resnet):
    tm = Session(resnet)
    tm.freeze("layer1")
    assert tm.freeze("layer1", dry_run=True).unchanged


# -- mixed precision ---------------------------------------------------------------------


def test_amp_on_before_any_model(ip, bf16_native):
    with capture_output() as cap:
        run(ip, "%amp on")
    session = torchmagic.notebook_session()
    assert session.amp.enabled and session.amp.device_type == "cpu"
    assert "autocast bf16 on cpu" in text_of(cap)


def test_cell_amp_before_any_model(ip, bf16_native):
    run(ip, "import torch")
    run(ip, "%%amp\nout = torch.randn(4, 4) @ torch.randn(4, 4)")
    assert ip.user_ns["out"].dtype is torch.bfloat16


def test_auto_keeps_fp32_on_a_cpu_without_bf16(ip, bf16_emulated):
    run(ip, "import torch")
    with capture_output() as cap:
        run(ip, "%amp on")
    session = torchmagic.notebook_session()
    assert not session.amp.enabled and session.amp.dtype is None
    assert text_of(cap).startswith("AMP off: fp32 is kept, as this CPU has no native bf16")
    run(ip, "%%amp\nout = torch.randn(4, 4) @ torch.randn(4, 4)")
    assert ip.user_ns["out"].dtype is torch.float32


def test_explicit_bf16_on_a_cpu_without_bf16_warns(ip, bf16_emulated):
    with capture_output() as cap:
        run(ip, "%amp on bf16")
    session = torchmagic.notebook_session()
    assert session.amp.enabled and session.amp.dtype is torch.bfloat16
    assert "will likely be slower than fp32" in text_of(cap)


def test_auto_uses_bf16_on_a_cpu_with_bf16(bf16_native):
    status = amp.AmpController().turn_on("cpu", "auto")
    assert status.enabled and status.dtype == "bf16" and not status.note


@pytest.mark.parametrize(
    "flags, native",
    [("fpu sse avx2 avx512f", False), ("fpu avx512f avx512_bf16", True), ("amx_bf16", True)],
)
def test_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(amp, "CPUINFO", str(cpuinfo))
    amp.cpu_has_native_bf16.cache_clear()
    try:
        assert amp.cpu_has_native_bf16() is native
    finally:
        amp.cpu_has_native_bf16.cache_clear()


# -- what the last traceback holds -------------------------------------------------------


def test_a_global_tensor_is_not_blamed_on_the_traceback(ip, monkeypatch):
    monkeypatch.setattr(sys, "last_traceback", None, raising=False)
    run(
        ip,
        """
import torch
data = torch.zeros(1024, 256)              # 1 MiB, a global: not the traceback's
def step(batch):
    activations = torch.zeros(512, 256)    # 0.5 MiB, only the failed frame holds it
    raise RuntimeError("boom")
""",
    )
    ip.run_cell("step(data)")
    assert sys.last_traceback is not None
    frames, nbytes = memory.traceback_hold(ip.user_ns)
    assert frames >= 2 and nbytes == 512 * 256 * 4
    assert memory.traceback_hold()[1] == 512 * 256 * 4  # the cell's globals are the namespace
    report = torchmagic.notebook_session().memory()
    assert report.traceback_bytes == 512 * 256 * 4
