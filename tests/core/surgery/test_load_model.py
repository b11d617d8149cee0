"""load_model engine: weights by name with the modern API, metadata read offline from
the enum, and an offline download failure as one clear error. The network is never
touched: TORCH_HOME is a fresh directory and torch.hub's download raises."""

from __future__ import annotations

import importlib.util
import urllib.error

import pytest
import torch
from torchvision.models import ResNet18_Weights, ResNet50_Weights

from torchmagic.core import zoo
from torchmagic.core.errors import TorchMagicError


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """An empty TORCH_HOME and a download that fails as it does without a network."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if importlib.util.find_spec("huggingface_hub") is not None:  # read at import: patch it
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    calls = []

    def no_network(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    return calls


def test_metadata_of_default_weights_is_read_offline(offline):
    info = zoo.weights_info("resnet18", "DEFAULT")
    assert info.name == "ResNet18_Weights.IMAGENET1K_V1"
    assert info.num_params == 11_689_512 and info.num_categories == 1000
    assert info.crop_size == 224 and info.resize_size == 256
    assert info.mean == (0.485, 0.456, 0.406) and info.std == (0.229, 0.224, 0.225)
    assert ("ImageNet-1K", "acc@1", 69.758) in info.metrics
    assert offline == []  # nothing was downloaded


def test_named_weights_and_their_own_transforms():
    assert zoo.torchvision_weights("resnet50", "IMAGENET1K_V2") is ResNet50_Weights.IMAGENET1K_V2
    assert zoo.torchvision_weights("resnet50", "ResNet50_Weights.IMAGENET1K_V2") is (
        ResNet50_Weights.IMAGENET1K_V2
    )
    v2 = zoo.weights_info("resnet50", "IMAGENET1K_V2")
    assert v2.resize_size == 232 and v2.crop_size == 224  # V2's preset differs from V1's
    assert zoo.expected_inputs(ResNet18_Weights.DEFAULT).name.endswith("IMAGENET1K_V1")
    assert zoo.is_weights(ResNet18_Weights.DEFAULT) and not zoo.is_weights("DEFAULT")


@pytest.mark.parametrize("spec", [None, "none", "None"])
def test_no_weights_builds_offline(spec, offline):
    loaded = zoo.load_model("resnet18", spec)
    assert loaded.weights is None and loaded.preprocess is None and loaded.info is None
    assert loaded.model.fc.out_features == 1000 and loaded.source == "torchvision"
    assert offline == []


def test_default_weights_offline_fail_in_one_clear_line(offline):
    with pytest.raises(TorchMagicError) as info:
        zoo.load_model("resnet18", "DEFAULT")
    message = str(info.value)
    assert "\n" not in message and info.value.param == "weights"
    assert "cannot fetch the weights ResNet18_Weights.IMAGENET1K_V1" in message
    assert "Temporary failure in name resolution" in message
    assert "weights=None" in message and "checkpoints" in message
    assert len(offline) == 1 and offline[0].endswith(".pth")


def test_weights_found_in_the_cache_need_no_network(tmp_path, offline):
    """A checkpoint already under TORCH_HOME is used: the metadata, transforms and
    categories come back with it (a random state dict stands in for the real file)."""
    weights = ResNet18_Weights.IMAGENET1K_V1
    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.manual_seed(0)
    state = zoo.load_model("resnet18", None).model.state_dict()
    torch.save(state, checkpoints / weights.url.rpartition("/")[2])
    loaded = zoo.load_model("resnet18", "DEFAULT")
    assert loaded.weights is weights and offline == []
    assert torch.equal(loaded.model.fc.weight, state["fc.weight"])
    assert loaded.categories[0] == "tench" and len(loaded.categories) == 1000
    assert list(loaded.preprocess.crop_size) == [224] and loaded.info.crop_size == 224


def test_bad_names_and_weights_are_one_error():
    with pytest.raises(TorchMagicError, match="did you mean resnet18") as info:
        zoo.load_model("resnet19", None)
    assert info.value.param == "name"
    with pytest.raises(TorchMagicError, match="IMAGENET1K_V1, IMAGENET1K_V2") as info:
        zoo.torchvision_weights("resnet50", "IMAGENET1K_V9")
    assert info.value.param == "weights"
    with pytest.raises(TorchMagicError, match="names no model"):
        zoo.split_source("timm:")


def test_timm_metadata_offline_and_no_weights_build():
    assert zoo.split_source("timm:resnet18") == ("timm", "resnet18")
    info = zoo.weights_info("timm:resnet18", "DEFAULT")
    assert info.name == "resnet18.a1_in1k" and info.source == "timm"
    assert info.crop_size == 224 and info.mean == (0.485, 0.456, 0.406)
    assert info.num_categories == 1000
    loaded = zoo.load_model("timm:resnet18", None)
    assert loaded.weights is None and loaded.model.fc.out_features == 1000


def test_timm_weights_offline_fail_in_one_line():
    with pytest.raises(TorchMagicError, match="cannot fetch the weights resnet18") as info:
        zoo.load_model("timm:resnet18", "DEFAULT")
    assert "\n" not in str(info.value) and "weights=None" in str(info.value)


def test_hugging_face_builds_from_a_model_type_offline():
    loaded = zoo.load_model("hf:resnet", None)
    assert loaded.source == "hf" and loaded.preprocess is None and loaded.weights is None
    assert loaded.info.num_categories == 2 and loaded.info.mean is None
    with pytest.raises(TorchMagicError, match="cannot fetch the weights") as info:
        zoo.load_model("hf:microsoft/resnet-18", "DEFAULT")
    assert "\n" not in str(info.value) and "hf:vit" in str(info.value)


def test_rendered_metadata():
    from torchmagic.render.base import Rendered
    from torchmagic.render.zoo import loaded_model, weights_table

    text = str(Rendered(weights_table(zoo.weights_info("resnet18")), width=120))
    assert "ImageNet-1K acc@1 │ 69.76" in text and "224×224 (resize 256" in text
    assert "random weights (weights=None)" in str(loaded_model(zoo.load_model("resnet18", None)))


def test_a_refused_head_binds_nothing():
    """A bad class count is refused after the build: no name it would bind is bound, and
    a model already bound under ``bind`` is still that model."""
    import torchmagic

    old = torch.nn.Linear(2, 2)
    ns: dict = {"net": old, "weights": "mine"}
    tm = torchmagic.Session(namespace=ns)
    with pytest.raises(TorchMagicError, match="num_classes must be a positive integer"):
        tm.load_model("resnet18", None, num_classes=0, bind="net")
    assert ns == {"net": old, "weights": "mine"} and ns["net"] is old
    assert tm.loaded == {} and tm.history() == ()


def test_a_refused_head_in_the_magic_binds_nothing(ip):
    from IPython.core.error import UsageError

    before = set(ip.user_ns)
    with pytest.raises(UsageError):
        ip.run_line_magic("load_model", "resnet18 --weights none --num-classes 0 --as net")
    assert set(ip.user_ns) == before and "net" not in ip.user_ns


class _RunsCode:
    """Unpickled, it would create a file: the proof that a load ran code."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.flag}",))


def test_a_planted_hub_file_is_refused_and_runs_no_code(tmp_path):
    """``$TORCH_HOME/hub/checkpoints/<resnet18's file>`` holding a pickle that runs code:
    refused in one line naming the global, the code never run, nothing bound."""
    import torchmagic

    folder = tmp_path / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    flag = tmp_path / "ran"
    url = ResNet18_Weights.DEFAULT.url
    torch.save({"fc.weight": _RunsCode(str(flag))}, folder / url.rsplit("/", 1)[1])
    ns: dict = {}
    tm = torchmagic.Session(namespace=ns)
    with pytest.raises(TorchMagicError) as error:
        tm.load_model("resnet18", "DEFAULT")
    message = str(error.value)
    assert "\n" not in message and "holds Python objects or code" in message
    assert "(posix.system)" in message or "(os.system)" in message
    assert not flag.exists() and ns == {}
