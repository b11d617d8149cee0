"""Session.export for inference (.pt2, .safetensors, .onnx): each file read in a fresh
process that has neither torchmagic nor peft, its outputs equal to the live model's, its
labels and preprocessing back; the live model unchanged; refusals leave no file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torchvision
from IPython.core.error import UsageError
from torch import nn

import torchmagic
from torchmagic.core.errors import TorchMagicError
from torchmagic.core.export import formats
from torchmagic.core.zoo import LoadedModel, WeightsInfo

SLOW = pytest.mark.slow  # a trace, or onnx's optimiser: over 10 s on two cores
CATEGORIES = ("cat", "dog", "fox", "owl")
INFO = WeightsInfo(
    "Tiny_Weights.TEST",
    "torchvision",
    crop_size=32,
    resize_size=36,
    mean=(0.5,) * 3,
    std=(0.25,) * 3,
)
SRC = str(Path(torchmagic.__file__).resolve().parents[1])

# Run in ``python -c``: torchmagic and peft cannot be imported (and src/ is off the path);
# the file is loaded the way its format's readers do, run on the saved probe batch, and
# the largest difference from the saved live outputs printed with the stored metadata.
_READER = """
import json, sys
sys.path = [p for p in sys.path if p not in ("", {src!r})]
sys.modules["torchmagic"] = None
sys.modules["peft"] = None
import torch
path, fmt = {path!r}, {fmt!r}
probe, live = torch.load({probe!r}, weights_only=True)
keys = ("labels", "preprocessing", "input", "producer")
if fmt == "pt2":
    meta = dict.fromkeys(keys, "")
    model = torch.export.load(path, extra_files=meta).module()
elif fmt == "safetensors":
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(path, "pt") as f:
        meta = f.metadata()
{build}
    model.load_state_dict(load_file(path), strict=True)
    model.eval()
else:
    import onnx, onnxruntime
    meta = {{p.key: p.value for p in onnx.load(path).metadata_props}}
    runner = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    model = lambda x: torch.from_numpy(runner.run(None, {{"input": x.numpy()}})[0])
with torch.no_grad():
    out = model(probe)
out = getattr(out, "logits", out)
assert "torchmagic" not in [m for m, v in sys.modules.items() if v is not None]
assert not any(m.startswith("peft") for m, v in sys.modules.items() if v is not None)
print(json.dumps({{
    "difference": float((out - live).abs().max()),
    "shape": list(out.shape),
    "labels": json.loads(meta["labels"]),
    "preprocessing": json.loads(meta["preprocessing"]),
}}))
"""


def read_elsewhere(path: Path, model: nn.Module, build: str, batch: torch.Tensor) -> dict:
    """The file read in a fresh process (see ``_READER``), on ``batch``; the live model's
    eval outputs on it as reference (its modes put back)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    with torch.no_grad():
        live = model(batch)
    for module, training in modes:
        module.training = training
    probe = path.with_name(path.name + ".probe.pt")
    torch.save((batch, getattr(live, "logits", live)), probe)
    code = _READER.format(
        src=SRC,
        path=str(path),
        fmt=path.suffix.lstrip("."),
        probe=str(probe),
        build=textwrap.indent(build, "    "),
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=path.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], v) for k, v in before.items())


# -- torchvision ---------------------------------------------------------------------------

TORCHVISION = "import torchvision\nmodel = torchvision.models.resnet18(num_classes=4)"


def _resnet_session() -> tuple[nn.Module, torchmagic.Session]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=4)
    model.layer4[1].bn2.running_mean.uniform_(-1, 1)  # BatchNorm in eval must show
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = torchmagic.Session(namespace={"model": model, "opt": opt})
    tm.loaded["model"] = LoadedModel(model, "resnet18", "torchvision", None, None, CATEGORIES, INFO)
    tm.freeze("model.layer1", bn="frozen")  # FrozenBatchNorm2d stand-ins
    tm.freeze("model.layer2")  # BatchNorm held in eval by our pre-hooks
    model.train()
    return model, tm


@SLOW
@pytest.mark.parametrize("suffix", [".pt2", ".safetensors"])
def test_torchvision_model_in_a_fresh_process(tmp_path, suffix):
    model, tm = _resnet_session()
    before, history = _state(model), len(tm.history())
    report = tm.export(tmp_path / f"model{suffix}")
    assert report.max_difference is not None and report.max_difference <= 1e-5
    assert report.labels == CATEGORIES
    assert report.preprocessing is not None and report.preprocessing.crop_size == 32
    assert report.probe_shape == (3, 3, 32, 32)  # derived from the weights' crop size
    # the live model as it was: stand-ins, hooks, modes, weights, history
    assert type(model.layer1[0].bn1).__name__ == "FrozenBatchNorm2d"
    assert model.layer2[0].bn1._forward_pre_hooks
    assert model.training and model.layer4[0].bn1.training
    _unchanged(model, before)
    assert len(tm.history()) == history
    seen = read_elsewhere(
        tmp_path / f"model{suffix}", model, TORCHVISION, torch.randn(5, 3, 32, 32)
    )
    assert seen["difference"] <= 1e-5 and seen["shape"] == [5, 4]
    assert seen["labels"] == list(CATEGORIES)
    assert seen["preprocessing"] == {
        "resize_size": 36,
        "crop_size": 32,
        "mean": [0.5] * 3,
        "std": [0.25] * 3,
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"model{suffix}", f"model{suffix}.probe.pt"]
    )


@SLOW
def test_torchvision_model_as_onnx(tmp_path):
    model, tm = _resnet_session()
    report = tm.export(tmp_path / "model.onnx")
    assert report.max_difference is not None and report.max_difference <= 1e-4
    seen = read_elsewhere(tmp_path / "model.onnx", model, TORCHVISION, torch.randn(5, 3, 32, 32))
    assert seen["difference"] <= 1e-4 and seen["labels"] == list(CATEGORIES)


# -- timm ----------------------------------------------------------------------------------

TIMM = "import timm\nmodel = timm.create_model('test_resnet', pretrained=False, num_classes=3)"


@pytest.mark.parametrize(
    "suffix", [pytest.param(".pt2", marks=SLOW), ".safetensors", pytest.param(".onnx", marks=SLOW)]
)
def test_timm_model_in_a_fresh_process(tmp_path, suffix):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=3)
    tm = torchmagic.Session(model)
    tm.freeze("conv1")
    report = tm.export(tmp_path / f"m{suffix}", input_shape=(1, 3, 32, 32))
    assert report.max_difference is not None and report.max_difference <= 1e-5
    assert report.labels is None and report.preprocessing is None
    seen = read_elsewhere(tmp_path / f"m{suffix}", model, TIMM, torch.randn(4, 3, 32, 32))
    assert seen["difference"] <= 1e-5 and seen["shape"] == [4, 3]
    assert seen["labels"] is None


def test_timm_input_comes_from_its_pretrained_config(tmp_path):
    timm = pytest.importorskip("timm")
    model = timm.create_model("test_resnet", pretrained=False, num_classes=3)
    report = torchmagic.Session(model).export(tmp_path / "m.safetensors")
    assert report.probe_shape == (3, *model.pretrained_cfg["input_size"])


# -- Hugging Face --------------------------------------------------------------------------

BERT = """\
from transformers import BertConfig, BertForSequenceClassification
config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=32, num_labels=3)
model = BertForSequenceClassification(config)"""


def _bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
        id2label={0: "neg", 1: "neu", 2: "pos"},
    )
    return transformers.BertForSequenceClassification(config)


@SLOW
@pytest.mark.parametrize("suffix", [".pt2", ".safetensors", ".onnx"])
def test_hugging_face_classifier_in_a_fresh_process(tmp_path, suffix):
    model = _bert()
    tm = torchmagic.Session(model)
    report = tm.export(tmp_path / f"bert{suffix}")
    assert report.probe_shape == (3, 16)  # token ids, from the config
    assert report.max_difference is not None and report.max_difference <= 1e-5
    assert report.labels == ("neg", "neu", "pos")
    ids = torch.randint(64, (5, 16))
    seen = read_elsewhere(tmp_path / f"bert{suffix}", model, BERT, ids)
    assert seen["difference"] <= 1e-5 and seen["shape"] == [5, 3]
    assert seen["labels"] == ["neg", "neu", "pos"]


# -- after %lora ---------------------------------------------------------------------------

NET = """\
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))"""


def _lora_session() -> tuple[nn.Module, torchmagic.Session]:
    pytest.importorskip("peft")
    namespace: dict = {}
    exec(NET, namespace)
    model = namespace["model"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tm = torchmagic.Session(namespace={"model": model, "opt": opt})
    tm.lora("model.5", "model.7", r=2)
    with torch.no_grad():  # adapters that change the outputs, as after training
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    return model, tm


@pytest.mark.parametrize("suffix", [".pt2", ".safetensors", pytest.param(".onnx", marks=SLOW)])
def test_lora_is_merged_into_the_file_only(tmp_path, suffix):
    model, tm = _lora_session()
    before, history = _state(model), len(tm.history())
    report = tm.export(tmp_path / f"net{suffix}", input_shape=(1, 3, 8, 8))
    assert report.merged_adapters == 2
    assert report.max_difference is not None and report.max_difference <= 1e-5
    assert type(model[5]).__name__ == "Linear" and hasattr(model[5], "lora_A")  # still peft's
    _unchanged(model, before)
    assert len(tm.history()) == history
    assert any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    seen = read_elsewhere(tmp_path / f"net{suffix}", model, NET, torch.randn(6, 3, 8, 8))
    assert seen["difference"] <= 1e-5 and seen["shape"] == [6, 5]


def test_switched_off_adapters_are_left_out(tmp_path):
    model, tm = _lora_session()
    tm.lora_off("model")
    report = tm.export(tmp_path / "net.safetensors", input_shape=(1, 3, 8, 8))
    assert report.max_difference is not None and report.max_difference <= 1e-5


# -- refusals leave no file ----------------------------------------------------------------


class Branchy(nn.Module):
    """A forward that branches on the data: torch.export cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


class Noisy(nn.Module):
    """Outputs that change from one call to the next, even in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.rand(x.shape[0], 2)


def test_an_untraceable_forward_names_safetensors(tmp_path):
    tm = torchmagic.Session(Branchy())
    with pytest.raises(TorchMagicError, match=r"cannot trace .*a \.safetensors path") as err:
        tm.export(tmp_path / "b.pt2", input_shape=(1, 4))
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []
    assert tm.export(tmp_path / "b.safetensors", input_shape=(1, 4)).max_difference == 0


def test_outputs_beyond_tolerance_are_refused(tmp_path):
    (tmp_path / "n.pt2").write_text("old")
    tm = torchmagic.Session(Noisy())
    with pytest.raises(
        TorchMagicError, match=r"differ from the live model's .*nothing was written"
    ):
        tm.export(tmp_path / "n.pt2", input_shape=(1, 4), force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.pt2"]
    assert (tmp_path / "n.pt2").read_text() == "old"


def test_an_unknown_input_is_refused_naming_the_option(tmp_path):
    tm = torchmagic.Session(torchvision.models.resnet18(weights=None, num_classes=2))
    with pytest.raises(TorchMagicError, match=r"cannot tell what input .*input_shape=1,3,224,224"):
        tm.export(tmp_path / "r.pt2")
    with pytest.raises(TorchMagicError, match="batch first"):
        tm.export(tmp_path / "r.pt2", input_shape=(3,))
    assert list(tmp_path.iterdir()) == []


def test_missing_onnx_packages_are_named(tmp_path, monkeypatch):
    real = formats.importlib.util.find_spec
    monkeypatch.setattr(
        formats.importlib.util,
        "find_spec",
        lambda n, *a: None if n == "onnxscript" else real(n, *a),
    )
    tm = torchmagic.Session(nn.Linear(4, 2))
    with pytest.raises(TorchMagicError, match=r"\.onnx needs onnxscript: pip install onnxscript"):
        tm.export(tmp_path / "l.onnx", input_shape=(1, 4))
    assert list(tmp_path.iterdir()) == []


def test_the_model_option_picks_another_model(tmp_path):
    a, b = nn.Linear(4, 2), nn.Linear(4, 3)
    tm = torchmagic.Session(namespace={"a": a, "b": b})
    tm.use("a")
    report = tm.export(tmp_path / "b.safetensors", "b", input_shape=(1, 4))
    assert report.model_name == "b" and report.probe_shape == (3, 4)


def test_the_class_names_the_session_keeps_are_stored(tmp_path):
    """A head replaced with labels= on a plain model: its names go into the file."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    tm = torchmagic.Session(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tm.replace_head("2", labels=["ant", "bee", "wasp"])
    report = tm.export(tmp_path / "m.safetensors", input_shape=(1, 4))
    assert report.labels == ("ant", "bee", "wasp")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m.safetensors"), "pt") as stored:
        assert json.loads(stored.metadata()["labels"]) == ["ant", "bee", "wasp"]


# -- the magic -----------------------------------------------------------------------------


def test_the_magic_exports_and_speaks_flags(ip, tmp_path):
    ip.user_ns["net"] = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ip.user_ns["other"] = nn.Linear(4, 2)
    ip.run_line_magic("tm", "use other")
    with pytest.raises(UsageError, match=r"--input-shape 1,3,224,224"):
        ip.run_line_magic("tm", f"export {tmp_path / 'n.pt2'} --model net")
    ip.run_line_magic("tm", f"export {tmp_path / 'n.pt2'} --model net --input-shape 1,4")
    assert (tmp_path / "n.pt2").exists()
    with pytest.raises(UsageError, match="the file exists; --force replaces it"):
        ip.run_line_magic("tm", f"export {tmp_path / 'n.pt2'} --model net --input-shape 1,4")
    with pytest.raises(UsageError, match=r"--tolerance"):
        ip.run_line_magic(
            "tm", f"export {tmp_path / 'o.pt2'} --model net --input-shape 1,4 --tolerance -1"
        )
    assert not (tmp_path / "o.pt2").exists()
