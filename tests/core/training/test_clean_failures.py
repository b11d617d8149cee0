"""One clear line instead of a traceback, and training failures that leave
nothing behind. Every refusal here is one ``UsageError`` (a ``TorchMagicError`` in the
engine) and changes nothing: weights, BatchNorm statistics, flags, optimizer groups and
state, the session's runs and bindings."""

from __future__ import annotations

import builtins
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict

import pytest
import torch
from IPython.core.error import UsageError
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError, render
from torchmagic.core import zoo
from torchmagic.core.training.fit_events import StopReason
from torchmagic.magics.extension import loaded

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
train_loader = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(4)]
"""


def refused(ip, magic: str, line: str, match: str) -> str:
    """Run a magic that must be refused: one UsageError line, nothing changed."""
    ns = ip.user_ns
    before = snapshot(ns["model"], ns["optimizer"])
    sched = dict(ns["scheduler"].state_dict())
    runs = len(loaded(ip).session.fits)
    with pytest.raises(UsageError, match=match) as error:
        ip.run_line_magic(magic, line)
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    assert_same(before, snapshot(ns["model"], ns["optimizer"]))
    assert ns["scheduler"].state_dict() == sched
    assert len(loaded(ip).session.fits) == runs
    assert all(p.grad is None for p in ns["model"].parameters())
    return message


@pytest.fixture
def shell(ip):
    ip.run_cell(SETUP).raise_error()
    return ip


# -- a loss that does not fit the model's outputs -------------------------------------------


def test_the_model_given_as_the_loss_is_one_line_for_lr_find_and_fit(shell):
    said = refused(shell, "lr_find", "train_loader --loss model", "fails on the first batch")
    assert "--loss" in said and "TypeError" in said and "shape (8, 3)" in said
    refused(shell, "fit", "train_loader --max-steps 1 --loss model", "TypeError")


def test_mse_against_class_indices_is_one_line(shell):
    with pytest.warns(UserWarning):  # torch's own broadcasting warning comes first
        said = refused(shell, "lr_find", "train_loader --loss mse", "fails on the first batch")
    assert "RuntimeError" in said and "targets: a tensor of shape (8,)" in said


def test_nothing_trainable_is_refused_before_a_step(shell):
    shell.run_cell("for p in model.parameters(): p.requires_grad_(False)").raise_error()
    refused(shell, "lr_find", "train_loader", "nothing to train: every parameter")
    refused(shell, "fit", "train_loader --max-steps 1", "nothing to train")


def test_a_loss_that_is_not_one_number_is_refused():
    model = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model, opt)
    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    with pytest.raises(TorchMagicError, match="one number") as error:
        Session(model, opt).fit(data, loss=lambda out, y: out)
    assert error.value.param == "loss"
    assert_same(before, snapshot(model, opt))


def test_a_refused_run_leaves_no_progress_behind():
    """The refusal is the one line: the live view is emptied, no summary drawn."""
    drawn = []

    class Handle:
        def update(self, rendered):
            drawn.append(str(rendered))

    def show(rendered):
        drawn.append(str(rendered))
        return Handle()

    model = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    progress = render.NotebookProgress(show, 100)
    with pytest.raises(TorchMagicError):
        Session(namespace={"model": model, "optimizer": opt}).fit(
            data, loss="model", observer=progress
        )
    assert drawn and "fit 1" in drawn[0] and drawn[-1].strip() == ""


# -- training failures --------------------------------------------------------------------


class Flaky(nn.Module):
    """Raises in its forward on the ``n``-th call, after the BatchNorm before it ran."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.calls = itertools.count(1)
        self.n = n

    def forward(self, x):
        if next(self.calls) == self.n:
            raise RuntimeError("a forward that fails")
        return x


def flaky_model(n: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            body=nn.Linear(8, 16), norm=nn.BatchNorm1d(16), flaky=Flaky(n), fc=nn.Linear(16, 4)
        )
    )


def batches(n=5):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(10, 8, generator=g), torch.randint(0, 4, (10,), generator=g))] * n


@pytest.mark.parametrize("fails_at", [1, 3])
def test_a_forward_that_raises_leaves_no_statistics_of_its_batch(fails_at):
    model = flaky_model(fails_at)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    after_step = {0: model.norm.running_mean.clone()}
    opt.register_step_post_hook(
        lambda o, a, k: after_step.__setitem__(len(after_step), model.norm.running_mean.clone())
    )
    with pytest.raises(RuntimeError, match="a forward that fails"):
        Session(model, opt).fit(batches(), epochs=1)
    assert len(after_step) == fails_at  # steps 1 .. fails_at - 1 were applied
    assert torch.equal(model.norm.running_mean, after_step[fails_at - 1])
    assert int(model.norm.num_batches_tracked) == fails_at - 1
    assert all(p.grad is None for p in model.parameters())


def ctrl_c_on_call(n: int):
    calls = itertools.count(1)

    def loss(output, target):
        if next(calls) == n:
            os.kill(os.getpid(), signal.SIGINT)  # handled: the loop stops after this step
        return nn.functional.cross_entropy(output, target)

    return loss


def _interrupted_fit(data, batches_in_epoch: int):
    model = flaky_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    ns = {"model": model, "optimizer": opt, "scheduler": sched}
    ns["loss"] = ctrl_c_on_call(batches_in_epoch)  # the epoch's last batch
    history = Session(namespace=ns).fit(data, loss="loss", epochs=3)
    assert history.stop_reason is StopReason.INTERRUPTED
    assert history.steps == batches_in_epoch and len(history.epochs) == 1
    return history, sched


def test_ctrl_c_on_an_epochs_last_batch_steps_its_scheduler():
    history, sched = _interrupted_fit(batches(4), 4)
    assert sched.last_epoch == 1 and sched.get_last_lr() == pytest.approx([0.01])
    assert "cut" not in history.stopped


def test_ctrl_c_where_the_epoch_end_is_unknown_says_the_epoch_was_cut():
    class Stream:  # an iterable without a length: the loop cannot tell the last batch
        def __iter__(self):
            return iter(batches(4))

    history, sched = _interrupted_fit(Stream(), 4)
    assert sched.last_epoch == 0  # not stepped, and the summary says why
    assert history.stopped.endswith("epoch 1 was cut after 4 batches")


# -- a module registered twice ----------------------------------------------------------------


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.b = self.a  # the same module under a second name
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.b(self.a(x)))


@pytest.mark.parametrize("name", ["a", "b"])
def test_freezing_a_module_registered_twice_freezes_it_once(name):
    model = Twice()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = Session(namespace={"model": model, "optimizer": opt})
    change = tm.freeze(name)
    shared = list(model.a.parameters())
    assert all(not p.requires_grad for p in shared)
    assert change.effect.params == sum(p.numel() for p in shared) and not change.effect.notes
    held = [id(p) for g in opt.param_groups for p in g["params"]]
    assert all(id(p) not in held for p in shared) and len(held) == 2  # fc only, once each
    assert change.effect.bn_modes == {"held": 1}  # frozen, so its statistics stay
    model.train()
    stats = model.a[1].running_mean.clone()
    model(torch.randn(6, 4))
    assert torch.equal(stats, model.a[1].running_mean)
    tm.undo()
    assert all(p.requires_grad for p in model.parameters())
    model(torch.randn(6, 4))
    assert not torch.equal(stats, model.a[1].running_mean)  # follows train() again


def test_a_batchnorm_shared_with_a_module_outside_keeps_training_and_is_left_alone():
    """The other side of the rule: another module (not an alias of the frozen one) uses the
    BatchNorm, so its parameters keep training and its statistics are left alone."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4)
    model = nn.Sequential(
        OrderedDict(a=nn.Sequential(nn.Linear(4, 4), bn), c=nn.Sequential(bn), fc=nn.Linear(4, 2))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    change = Session(namespace={"model": model, "optimizer": opt}).freeze("a")
    assert not model.a[0].weight.requires_grad and bn.weight.requires_grad
    assert change.effect.notes and "keeps training" in change.effect.notes[0]
    assert "held" not in change.effect.bn_modes


# -- %load_model ------------------------------------------------------------------------------


def test_as_accepts_only_a_free_variable_name(ip):
    ip.run_cell(
        "import os, torch\nfrom torch import nn\nother, spare = nn.Linear(2, 2), None"
    ).raise_error()
    session = loaded(ip).session
    bound = dict(ip.user_ns)
    for name, why in [
        ("__builtins__", "builtin"),
        ("len", "builtin"),
        ("get_ipython", "builtin"),
        ("torch", "holds a module"),
        ("os", "holds a module"),
        ("In", "holds a list"),
        ("None", "not a Python variable name"),
        ("class", "not a Python variable name"),
        ("a.b", "not a Python variable name"),
        ("1abc", "not a Python variable name"),
        ('""', "not a Python variable name"),
        ("weights", "receives the model's weights"),
    ]:
        with pytest.raises(UsageError, match=why) as error:
            ip.run_line_magic("load_model", f"resnet18 --weights none --as {name}")
        assert "\n" not in str(error.value)
    assert ip.user_ns.keys() == bound.keys()
    assert all(ip.user_ns[k] is v for k, v in bound.items() if not k.startswith("_"))
    assert not session.loaded and ip.run_cell("len('abc')").result == 3
    for name in ("other", "spare"):  # a model, or None: replaced
        ip.run_line_magic("load_model", f"resnet18 --weights none --as {name}")
        assert type(ip.user_ns[name]).__name__ == "ResNet"
    assert session.loaded.keys() == {"other", "spare"}


def test_timm_weights_must_be_a_tag_not_a_path(ip):
    pytest.importorskip("timm")
    for spec in ("/tmp/weights.pth", "local-dir:/tmp/somewhere"):
        with pytest.raises(UsageError, match="pretrained tag") as error:
            ip.run_line_magic("load_model", f"timm:resnet18 --weights {spec}")
        assert "\n" not in str(error.value) and "model" not in ip.user_ns


def test_a_pickled_hf_directory_is_refused_in_one_line(ip, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=16,
        patch_size=8,
    )
    config.save_pretrained(tmp_path)
    torch.save({"run": Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UsageError, match="weights_only=True") as error:
        ip.run_line_magic("load_model", f"hf:{tmp_path}")
    assert "\n" not in str(error.value) and "(exec)" in str(error.value)
    assert "model" not in ip.user_ns and not os.path.exists(tmp_path / "ran")


class Evil:
    """A pickle that would run code: ``weights_only=True`` must refuse it."""

    def __reduce__(self):
        return (builtins.exec, ("open('ran', 'w')",))


def no_hub(*args, **kwargs):
    raise AssertionError("the hub was asked although it is offline")


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    """No weights cached anywhere: any load needs the hub."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch"))
    for setting in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(setting, raising=False)


@pytest.mark.parametrize("setting", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_settings_answer_without_asking_the_hub(ip, monkeypatch, empty_cache, setting):
    timm = pytest.importorskip("timm")
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv(setting, "1")
    monkeypatch.setattr(zoo, "_probe", no_hub)  # the setting alone decides
    monkeypatch.setattr(timm, "create_model", no_hub)
    auto = transformers.AutoModelForImageClassification
    monkeypatch.setattr(auto, "from_pretrained", no_hub)
    for name in ("timm:resnet18", "hf:google/vit-base-patch16-224"):
        with pytest.raises(UsageError, match=f"{setting} is set") as error:
            ip.run_line_magic("load_model", name)
        assert "\n" not in str(error.value) and "--weights None" in str(error.value)
    assert "model" not in ip.user_ns


def test_a_failed_probe_answers_without_asking_the_hub(ip, monkeypatch, empty_cache):
    timm = pytest.importorskip("timm")
    probes = []
    monkeypatch.setattr(zoo, "_probe", lambda: probes.append(1) or "the hub cannot be reached")
    monkeypatch.setattr(timm, "create_model", no_hub)
    with pytest.raises(UsageError, match="the hub cannot be reached"):
        ip.run_line_magic("load_model", "timm:resnet18")
    assert probes == [1]


def test_the_probe_gives_up_at_its_timeout(monkeypatch):
    """A connection that never answers (a hanging name lookup) is cut at the timeout."""
    import socket

    def hang(*args, **kwargs):
        time.sleep(0.5)
        raise OSError("too late")

    monkeypatch.setattr(socket, "create_connection", hang)
    assert zoo._probe(timeout=0.01) == "the hub did not answer within 0.01 s"


def test_cached_timm_weights_load_from_their_file_without_the_hub(monkeypatch, tmp_path):
    timm = pytest.importorskip("timm")
    file = tmp_path / "resnet10t.safetensors"
    seen = []
    monkeypatch.setattr(zoo, "_hub_cached", lambda repo, names: str(file))
    monkeypatch.setattr(zoo, "_maybe_cached_timm", lambda name: True)
    monkeypatch.setattr(zoo, "_probe", no_hub)
    real = timm.create_model

    def create(name, pretrained=False, **kwargs):
        seen.append((name, pretrained, kwargs))
        return real(name, pretrained=False)

    monkeypatch.setattr(timm, "create_model", create)
    zoo.load_model("timm:resnet10t")
    ((name, pretrained, kwargs),) = seen
    assert pretrained and kwargs == {"pretrained_cfg_overlay": {"file": str(file)}}


def test_offline_timm_without_a_cached_file_is_told_before_timm_is_imported(tmp_path):
    """Importing timm takes seconds: with nothing on disk the offline answer comes first."""
    code = (
        "import sys, torchmagic\n"
        "from torchmagic.core import zoo\n"
        "try:\n"
        "    zoo.load_model('timm:resnet18')\n"
        "except torchmagic.TorchMagicError as error:\n"
        "    print('refused:', error)\n"
        "print('timm' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "TORCH_HOME": str(tmp_path / "torch"),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("refused: cannot fetch the weights resnet18 (HF_HUB_OFFLINE is set)")
    assert lines[-1] == "False"
