"""What a checkpoint records about where it was written (Python, torch, torchvision, and
timm / transformers / peft where the model uses them; the zoo call that built it), the
warning a resume under another torch minor gives, and resuming into a float64 or bf16
model exactly as ``load_state_dict`` does it by hand."""

from __future__ import annotations

import importlib.metadata
import platform
import warnings

import pytest
import torch
from torch import nn

import torchmagic
from checkpoint_helpers import assert_same, state, structure
from torchmagic import render
from torchmagic.core.checkpoint import integrity


def _payload(path) -> dict:
    return torch.load(path, weights_only=True)


def _tiny(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int, dtype=torch.float32) -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(n):
        x = torch.randn(4, 6, generator=gen).to(dtype)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_a_plain_model_records_python_torch_and_torchvision_only(tmp_path):
    model = _tiny()
    tm = torchmagic.Session(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tm.save(tmp_path / "run.pt")
    payload = _payload(tmp_path / "run.pt")
    assert payload["environment"] == {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": importlib.metadata.version("torchvision"),
    }
    assert payload["model"]["zoo"] is None  # the user built it: the zoo knows nothing


def test_a_zoo_model_records_its_constructor_call(tmp_path):
    tm = torchmagic.Session()
    tm.load_model("resnet18", weights=None, num_classes=4)
    tm.save(tmp_path / "run.pt")
    payload = _payload(tmp_path / "run.pt")
    assert payload["model"]["zoo"] == {"source": "torchvision", "name": "resnet18", "weights": None}
    assert payload["model"]["class"] == "torchvision.models.resnet.ResNet"
    assert "timm" not in payload["environment"]


def test_a_timm_model_records_timm(tmp_path):
    timm = pytest.importorskip("timm")
    tm = torchmagic.Session()
    tm.load_model("timm:resnet18", weights=None)
    tm.save(tmp_path / "run.pt")
    payload = _payload(tmp_path / "run.pt")
    assert payload["environment"]["timm"] == timm.__version__
    assert payload["model"]["zoo"] == {"source": "timm", "name": "resnet18", "weights": None}
    assert "transformers" not in payload["environment"]


def test_a_hugging_face_model_with_lora_records_transformers_and_peft(tmp_path):
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = transformers.BertForSequenceClassification(config)
    tm = torchmagic.Session(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    tm.save(tmp_path / "plain.pt")
    assert "peft" not in _payload(tmp_path / "plain.pt")["environment"]
    tm.lora("bert.encoder.layer.0.attention.self.query", r=2)
    tm.save(tmp_path / "lora.pt")
    environment = _payload(tmp_path / "lora.pt")["environment"]
    assert environment["transformers"] == transformers.__version__
    assert environment["peft"] == importlib.metadata.version("peft")
    assert "timm" not in environment


def _saved_under(tmp_path, version: str):
    """A saved session whose file says it was written under torch ``version``."""
    model = _tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _steps(model, opt, 1)
    torchmagic.Session(model, opt).save(tmp_path / "run.pt")
    payload = _payload(tmp_path / "run.pt")
    payload["environment"]["torch"] = payload["torch"] = version
    del payload["digests"]
    integrity.write_digests(payload)  # as that torch would have written it: digests match
    torch.save(payload, tmp_path / "run.pt")
    fresh = _tiny(seed=1)
    return tmp_path / "run.pt", fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2)


def _other_minor() -> str:
    major, minor = torch.__version__.split(".")[:2]
    return f"{major}.{int(minor) + 1}.0"


def test_resuming_under_another_torch_minor_warns_in_one_line(tmp_path):
    path, fresh, opt = _saved_under(tmp_path, _other_minor())
    with pytest.warns(UserWarning) as caught:
        torchmagic.resume(path, fresh, opt)
    (warning,) = caught
    text = str(warning.message)
    assert "\n" not in text
    assert text.startswith(f"written under torch {_other_minor()}, resumed under torch ")
    report = torchmagic.Session(*_saved_under(tmp_path, _other_minor())[1:]).load(path)
    assert report.warnings == (text,)
    assert text in " ".join(str(render.Rendered(render.render(report).renderable, 400)).split())


def test_another_patch_release_does_not_warn(tmp_path):
    major, minor = torch.__version__.split(".")[:2]
    path, fresh, opt = _saved_under(tmp_path, f"{major}.{minor}.99")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchmagic.resume(path, fresh, opt)


def _by_hand(saved: dict, dtype: torch.dtype) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same resume in plain PyTorch: the model cast, then load_state_dict on both (the
    optimizer's casts each state but ``step`` to its parameter's dtype)."""
    model = _tiny(seed=2).to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    return model, opt


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bf16"])
def test_resuming_into_another_dtype_casts_as_load_state_dict_does(tmp_path, dtype):
    model = _tiny()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _steps(model, opt, 2)
    torchmagic.Session(model, opt).save(tmp_path / "run.pt")
    saved = {"model": model.state_dict(), "optimizer": opt.state_dict()}

    fresh = _tiny(seed=1).to(dtype)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    torchmagic.resume(tmp_path / "run.pt", fresh, fresh_opt)
    hand, hand_opt = _by_hand(saved, dtype)

    assert_same(structure(hand, hand_opt), structure(fresh, fresh_opt))
    assert_same(state(hand, hand_opt), state(fresh, fresh_opt))
    exp_avg = fresh_opt.state[fresh[0].weight]
    assert exp_avg["exp_avg"].dtype == exp_avg["exp_avg_sq"].dtype == dtype
    assert exp_avg["step"].dtype == torch.float32  # left as it is, as torch leaves it
    _steps(fresh, fresh_opt, 1, dtype)  # the step that crashed before
    _steps(hand, hand_opt, 1, dtype)
    assert_same(state(hand, hand_opt), state(fresh, fresh_opt))
