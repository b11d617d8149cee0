"""%tm doctor engine: each classic mistake built by hand is named, a healthy session
reports nothing. CPU only; the meta device stands in for a wrong device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torchvision
from IPython.utils.capture import capture_output
from torch import nn

from cuda_fakes import no_cuda
from torchmagic import Session, render
from torchmagic.core.advice import Call
from torchmagic.core.diagnostics.compiled import CompileWatch, is_compiled
from torchmagic.core.diagnostics.doctor import diagnose
from torchmagic.core.training.amp import AmpController
from torchmagic.magics.spelling import magic_line
from torchmagic.render.doctor import doctor as render_doctor

META = torch.device("meta")


def stage(channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
        )
    )


class Tiny(nn.Module):
    """resnet's naming (conv1, bn1, layer1-4, fc) at a size that trains in milliseconds."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1, self.layer2, self.layer3, self.layer4 = (stage(8) for _ in range(4))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.bn1(self.conv1(x))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Tiny()


@pytest.fixture
def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=10)


def train_step(model, opt, zero=True):
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    opt.step()
    if zero:
        opt.zero_grad()


def checks(report, severity=None):
    return [f.check for f in report.findings if severity in (None, f.severity)]


def only(report, check):
    found = [f for f in report.findings if f.check == check]
    assert found, f"doctor did not report {check}: {report.findings}"
    return found


def test_healthy_session_reports_nothing(resnet18):
    model = resnet18
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=100)
    ns = {"model": model, "optimizer": opt, "scheduler": sched, "losses": [0.5, 0.4]}
    tm = Session(namespace=ns)
    tm.freeze("layer1-3")
    tm.unfreeze("layer3", lr=1e-4)  # a new group, kept in step with the scheduler
    tm.freeze("layer3")
    model.train()  # BatchNorm of frozen blocks stays held
    train_step(model, opt)
    sched.step()
    ns["losses"].append(torch.tensor(0.3))  # a tensor without a graph is fine
    ns["scaler"] = torch.amp.GradScaler("cpu", enabled=False)
    report = diagnose(ns, amp=AmpController(), compile_watch=CompileWatch())
    assert report.findings == ()
    assert "model (ResNet)" in report.scanned and "optimizer (AdamW)" in report.scanned
    assert "no problems found" in str(render_doctor(report))


# 1 -------------------------------------------------------------------------------------


def test_unfrozen_but_not_in_the_optimizer(model):
    for p in model.parameters():
        p.requires_grad_(False)
    for p in model.fc.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
    for p in model.layer4.parameters():  # "unfreeze" layer4 by hand only
        p.requires_grad_(True)
    model.eval()
    report = diagnose({"model": model, "opt": opt})
    (finding,) = only(report, "unoptimized")
    assert finding.severity == "error" and "layer4.0.0.weight" in finding.subject
    assert "in no param group of opt" in finding.message and finding.message.startswith("3 ")
    assert finding.fix.startswith('tm.unfreeze("model.layer4", lr=')
    assert checks(report) == ["unoptimized"]


# 2 -------------------------------------------------------------------------------------


def test_frozen_but_still_in_the_optimizer_with_state(model):
    opt = torch.optim.AdamW(model.parameters())
    train_step(model, opt)
    for p in model.layer1.parameters():  # the naive freeze
        p.requires_grad_(False)
    model.eval()
    report = diagnose({"model": model, "opt": opt})
    (finding,) = only(report, "frozen-in-optimizer")
    assert finding.severity == "warning" and "layer1.0.0.weight" in finding.subject
    state = sum(
        v.numel() * v.element_size()
        for p in model.layer1.parameters()
        for v in opt.state[p].values()
    )
    assert finding.nbytes == state and "hold optimizer state" in finding.message
    assert finding.fix.startswith('tm.freeze("model.layer1")')


def test_frozen_with_zero_grads_keeps_moving(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    train_step(model, opt, zero=False)
    opt.zero_grad(set_to_none=False)  # zeros, not None
    for p in model.layer2.parameters():
        p.requires_grad_(False)
    model.eval()
    report = diagnose({"model": model, "opt": opt})
    errors = [f for f in only(report, "frozen-in-optimizer") if f.severity == "error"]
    assert len(errors) == 1 and "still have a .grad" in errors[0].message
    assert "zero_grad(set_to_none=True)" in errors[0].fix
    # and it is real: the next step moves the frozen weights
    before = model.layer2[0][0].weight.detach().clone()
    train_step(model, opt)
    assert not torch.equal(before, model.layer2[0][0].weight)


# 3 -------------------------------------------------------------------------------------


def test_batchnorm_of_frozen_blocks_in_train_mode(model):
    for p in model.layer1.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
    model.train()
    report = diagnose({"model": model, "opt": opt})
    (finding,) = only(report, "bn-drift")
    assert finding.subject == "model: layer1.0.1" and "1 BatchNorm layer(s)" in finding.message
    assert finding.fix.startswith('tm.freeze("model.layer1")')
    model.eval()
    assert "bn-drift" not in checks(diagnose({"model": model, "opt": opt}))


def test_batchnorm_without_affine_parameters_judged_by_its_block():
    block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False))
    net = nn.Sequential(block, nn.Flatten(), nn.Linear(4, 2))
    for p in block.parameters():
        p.requires_grad_(False)
    (finding,) = only(diagnose({"net": net}), "bn-drift")
    assert finding.subject == "net: 0.1"


# 4 -------------------------------------------------------------------------------------


def test_tensors_on_different_devices(model):
    opt = torch.optim.AdamW(model.parameters())
    train_step(model, opt)
    model.eval()
    model.anchors = torch.zeros(5, device=META)  # not a registered buffer
    model.layer4[0][0].extra = [torch.zeros(2, device=META)]
    fc = model.fc.weight
    opt.state[fc]["exp_avg"] = opt.state[fc]["exp_avg"].to(META)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones((), device=META))
    report = diagnose({"model": model, "opt": opt, "scaler": scaler})
    found = {f.subject: f for f in only(report, "device")}
    assert set(found) == {
        "model: anchors",
        "model: layer4.0.0.extra[0]",
        "model: opt.state[fc.weight].exp_avg",
        "model: GradScaler._scale",
    }
    assert all(f.severity == "error" for f in found.values())
    assert "register_buffer('anchors'" in found["model: anchors"].fix
    assert "on meta, the model is on cpu" in found["model: anchors"].message


def test_parameters_on_another_device_are_grouped(resnet18):
    resnet18.eval()
    resnet18.layer1.to(META)
    found = only(diagnose({"model": resnet18}), "device")
    (params,) = [f for f in found if " parameter " in f.message]
    assert params.message == "12 parameter tensor(s) on meta, the model is on cpu"
    assert params.subject.endswith("and 9 more")
    (buffers,) = [f for f in found if " buffer " in f.message]
    assert buffers.message.startswith("12 buffer tensor(s) on meta")


def test_model_trained_off_the_session_device(model):
    model.eval()
    opt = torch.optim.AdamW(model.parameters())
    ns = {"model": model, "opt": opt, "teacher": Tiny().eval()}  # teacher: no optimizer
    assert diagnose(ns, device=torch.device("cpu")).findings == ()
    (finding,) = diagnose(ns, device=META).findings
    assert finding.subject == "model" and "session device is meta" in finding.message
    assert finding.fix.startswith('tm.move("model") moves model')
    assert "model.to('meta')" in finding.fix


def test_lazy_modules_do_not_trip_the_scan():
    net = nn.Sequential(nn.Linear(3, 4), nn.LazyLinear(2))
    opt = torch.optim.AdamW(net.parameters())
    assert diagnose({"net": net, "opt": opt}).findings == ()


# 5 -------------------------------------------------------------------------------------


def test_fp16_autocast_on_the_cpu(model):
    model.eval()
    amp = SimpleNamespace(enabled=True, dtype=torch.float16, device_type="cpu")
    (finding,) = only(diagnose({"model": model}, amp=amp), "amp")
    assert "fp16 autocast on the CPU" in finding.message and "bf16" in finding.fix


def test_gradscaler_with_bf16(model):
    model.eval()
    amp = AmpController()
    amp.turn_on("cpu", "bf16")
    ns = {"model": model, "scaler": torch.amp.GradScaler("cpu")}
    (finding,) = only(diagnose(ns, amp=amp), "amp")
    assert "GradScaler with bf16" in finding.message


def test_half_model_with_an_active_scaler(model):
    model.eval()
    model.half()
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters()), "teacher": Tiny().half()}
    scaler = torch.amp.GradScaler("cpu")
    (finding,) = only(diagnose(ns, scaler=scaler), "amp")  # the teacher is not trained
    assert finding.severity == "error" and finding.subject == "model"
    assert ".half()" in finding.message
    assert "amp" not in checks(diagnose(ns))  # fp16 weights without a scaler: no finding


# 6 -------------------------------------------------------------------------------------


def test_scheduler_lists_out_of_step(model):
    model.eval()
    opt = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    cyc = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10)
    opt.add_param_group({"params": list(model.layer4.parameters()), "lr": 0.01})  # by hand
    report = diagnose({"model": model, "opt": opt, "schedulers": [sched, cyc]})
    found = {f.subject: f for f in only(report, "scheduler")}
    assert "base_lrs has 1" in found["StepLR on opt"].message
    assert "group 1 lacks 'max_lr'" in found["OneCycleLR on opt"].message


def test_scheduler_of_a_recreated_optimizer(model):
    model.eval()
    old = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(old, step_size=1)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1), "sched": sched}
    (finding,) = only(diagnose(ns), "scheduler")
    assert finding.severity == "warning" and "no variable holds" in finding.message


# 7 -------------------------------------------------------------------------------------


def test_lists_that_keep_graphs_alive(model):
    model.eval()
    losses, history = [], {}
    for i in range(3):
        loss = model(torch.randn(1, 3, 8, 8)).sum()
        losses.append(loss)
        history[i] = (loss.item(), loss * 2)
    ns = {"model": model, "losses": losses, "history": history, "fine": [1.0, 2.0]}
    found = {f.subject: f for f in only(diagnose(ns), "graph-leak")}
    assert set(found) == {"losses", "history"}
    assert "keeps 3 tensor(s) with a grad_fn" in found["losses"].message
    assert "loss.item()" in found["losses"].fix and "history" in found["history"].fix


# 8 -------------------------------------------------------------------------------------


def test_data_parallel(model, monkeypatch):
    no_cuda(monkeypatch)  # with GPUs, DataParallel would move the model to cuda:0
    model.eval()
    wrapped = nn.DataParallel(model)
    (finding,) = only(diagnose({"model": wrapped}), "data-parallel")
    # no GPU: nothing about GPUs, only that the wrapper does nothing
    assert finding.severity == "info" and "without a GPU only wraps" in finding.message
    assert "GPUs through threads" not in finding.message and "model.module" in finding.fix
    wrapped.device_ids = [0, 1]  # as built on a machine with two GPUs
    (finding,) = only(diagnose({"model": wrapped}), "data-parallel")
    assert finding.severity == "warning" and "every GPU through threads" in finding.message
    assert "DistributedDataParallel" in finding.fix


def test_compiled_model_changed_after_compile(resnet18):
    model = resnet18.eval()
    compiled = torch.compile(model)  # not run: nothing is traced
    assert is_compiled(compiled) and not is_compiled(model)
    ns = {"model": model, "compiled": compiled}
    watch = CompileWatch()
    assert diagnose(ns, compile_watch=watch).findings == ()  # first sight: the baseline
    Session(namespace=ns).freeze("model.layer1")
    ns["model"].fc = nn.Linear(512, 3)
    ns["model"].layer4 = nn.Sequential(nn.Conv2d(256, 512, 1))
    (finding,) = only(diagnose(ns, compile_watch=watch), "compiled-changed")
    assert finding.subject == "compiled"
    assert "replaced or added layer4, fc;" in finding.message  # not layer4's insides
    assert "removed" not in finding.message  # layer4's old blocks went with it
    assert "requires_grad changed on layer1.0.conv1.weight" in finding.message
    text = str(render_doctor(diagnose(ns, compile_watch=watch), width=120))
    assert "compiled-changed" in text and "torch.compile" in text


def test_in_place_compile_is_recognised():
    net = nn.Linear(2, 2)
    net.compile()
    assert is_compiled(net)


def test_fixes_name_magics_in_a_notebook_and_python_calls_in_a_script(ip):
    """A notebook has no ``tm``: its fixes are the magic lines to type; the Python API
    keeps Python calls. The same Finding carries both (its commands are values)."""
    ip.run_cell(
        "import torch, torchvision\n"
        "model = torchvision.models.resnet18(weights=None)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n"
        "model(torch.randn(2, 3, 32, 32)).sum().backward()\n"
        "optimizer.step()\n"
        "optimizer.zero_grad(set_to_none=False)\n"
        "for p in model.layer1.parameters(): p.requires_grad = False\n"
    ).raise_error()
    ip.run_line_magic("config", "TorchMagics.width = 300")  # one line per finding
    with capture_output() as cap:
        ip.run_line_magic("tm", "doctor")
    shown = cap.outputs[0].data["text/plain"]
    assert "%freeze model.layer1 (takes them out of optimizer)" in shown
    assert "tm.freeze" not in shown and "tm.undo" not in shown
    assert "%tm undo brings it back" in shown
    report = Session(ip.user_ns["model"], ip.user_ns["optimizer"]).doctor()
    script = str(render.render(report, 300))
    assert 'tm.freeze("model.layer1") (takes them out of optimizer)' in script
    assert "%freeze" not in script


def test_magic_spelling_of_each_suggested_command():
    freeze = Call("freeze", ("model.layer1", "model.fc"))
    assert magic_line(freeze) == "%freeze model.layer1 model.fc"
    unfreeze = Call("unfreeze", ("model.a",), (("lr", "…"),), more=True)
    assert magic_line(unfreeze) == "%unfreeze model.a … lr=…"
    assert unfreeze.python() == 'tm.unfreeze("model.a", …, lr=…)'
    assert magic_line(Call("replace_head", ("model.fc", 7))) == "%replace_head model.fc 7"
    assert magic_line(Call("amp_on", ("bf16",))) == "%amp on bf16"
    assert magic_line(Call("move", ("model",))) == "%device move model"
    assert magic_line(Call("move", mention=True)) == "%device move"
    assert magic_line(Call("undo")) == "%tm undo" and Call("undo").python() == "tm.undo()"
