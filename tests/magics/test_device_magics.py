"""%device, %gpumem and %tm doctor on a fresh shell (CPU; GPUs hidden where a test needs none)."""

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
"""


def shown(ip, line):
    with capture_output() as cap:
        ip.run_cell(line).raise_error()
    assert all("text/html" in o.data for o in cap.outputs)
    return "\n".join(o.data["text/plain"] for o in cap.outputs) + cap.stdout


def test_device_lists_and_sets(ip, monkeypatch):
    no_cuda(monkeypatch)
    ip.run_cell(SETUP).raise_error()
    text = shown(ip, "%device")
    assert "cpu" in text and "session device" in text
    shown(ip, "%device cpu")
    session = torchmagic.notebook_session()
    assert session.device == torch.device("cpu")
    with pytest.raises(UsageError, match="not available"):
        ip.run_line_magic("device", "cuda:0")
    assert session.device == torch.device("cpu")
    with pytest.raises(UsageError, match="^%device takes cuda:N.cpu.mps.auto, got 'cpu extra'$"):
        ip.run_line_magic("device", "cpu extra")
    with pytest.raises(
        UsageError, match="^%device pinbench needs LOADER: %device pinbench LOADER$"
    ):
        ip.run_line_magic("device", "pinbench")


def test_device_check_finds_an_unregistered_tensor(ip):
    ip.run_cell(SETUP + "model.mask = torch.zeros(3, device='meta')").raise_error()
    text = shown(ip, "%device check")
    assert "mask" in text and "meta" in text and "register_buffer" in text


def test_device_move_and_pinbench_without_cuda(ip, monkeypatch):
    no_cuda(monkeypatch)
    ip.run_cell(
        SETUP + "from torch.utils.data import DataLoader, TensorDataset\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 8)), batch_size=4)"
    ).raise_error()
    assert "nothing to move" in shown(ip, "%device move")
    assert "no CUDA device" in shown(ip, "%device pinbench loader")


def test_gpumem_breakdown_estimate_and_the_saving_of_freeze(ip):
    ip.run_cell(SETUP).raise_error()
    assert "parameters, trainable" in shown(ip, "%gpumem")
    before = shown(ip, "%gpumem estimate --input-shape 4,8")
    assert "activations" in before and "optimizer state" in before
    shown(ip, "%freeze 0")
    assert "saves" in shown(ip, "%gpumem estimate")
    with pytest.raises(UsageError, match="--input-shape"):
        ip.run_line_magic("gpumem", "estimate --input-shape 4,x")


def test_gpumem_watch_prints_a_line_per_cell(ip):
    ip.run_cell(SETUP).raise_error()
    shown(ip, "%gpumem watch on")
    assert "peak" in shown(ip, "x = torch.randn(256, 256)")
    shown(ip, "%gpumem watch off")
    assert "peak" not in shown(ip, "y = 1")
    assert "peak counters reset" in shown(ip, "%gpumem reset --tracebacks")


def test_doctor_healthy_then_names_the_unfreeze_bug(ip):
    ip.run_cell(SETUP).raise_error()
    shown(ip, "%freeze 0")
    assert "no problems found" in shown(ip, "%tm doctor")
    # unfrozen by hand: requires grad, but in no param group
    ip.run_cell("model[0].weight.requires_grad_(True)").raise_error()
    text = shown(ip, "%tm doctor")
    assert "0.weight" in text and "optimizer" in text


def test_unload_unhooks_events(ip):
    shown(ip, "%gpumem watch on")
    ip.run_line_magic("unload_ext", "torchmagic")

    def ours(callback) -> bool:
        return type(getattr(callback, "__self__", None)).__module__.startswith("torchmagic")

    callbacks = ip.events.callbacks
    assert not any(ours(cb) for cb in callbacks["post_run_cell"] + callbacks["pre_run_cell"])
    assert not any(type(c).__module__.startswith("torchmagic") for c in ip.configurables)


def test_gpumem_watch_switched_off_then_on_reports_no_stale_cell(ip):
    """The cell that switched the watch off began watched; switched on again, the next
    line is about a cell that began watched, never that old start."""
    ip.run_cell(SETUP).raise_error()
    shown(ip, "%gpumem watch on")
    shown(ip, "%gpumem watch off")
    assert "peak" not in shown(ip, "%gpumem watch on")  # this cell began unwatched
    assert "peak" in shown(ip, "x = torch.randn(256, 256)")
    shown(ip, "%gpumem watch off")
