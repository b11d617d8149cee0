"""``%load_data``: loaders bound with the loaded weights' transforms, the folder's classes
sizing ``%replace_head auto``, and every refusal one line with nothing bound."""

from __future__ import annotations

import shutil

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch.utils.data import DataLoader, Subset
from torchvision.datasets import ImageFolder
from torchvision.models import ResNet18_Weights, resnet18

import torchmagic
from image_folders import class_folders


@pytest.fixture
def cached_weights(tmp_path, monkeypatch):
    """resnet18's DEFAULT weights as a user's cache holds them after the first download
    (a random state dict stands in for the real file)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    checkpoints = tmp_path / "torch_home" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(
        resnet18().state_dict(), checkpoints / ResNet18_Weights.DEFAULT.url.rpartition("/")[2]
    )


def _run(ip, line):
    with capture_output() as shown:
        ip.run_line_magic("load_data", line)
    return "\n".join(str(o.data.get("text/plain", "")) for o in shown.outputs)


def test_load_data_binds_loaders_with_the_weights_transforms(ip, tmp_path, cached_weights):
    root = class_folders(tmp_path / "images", {"ants": 6, "bees": 6, "wasps": 3})
    with capture_output():
        ip.run_line_magic("load_model", "resnet18 --weights DEFAULT")
    text = _run(ip, f"{root} --valid 0.2 --batch 2 --workers 0")
    train, val = ip.user_ns["train_loader"], ip.user_ns["val_loader"]
    assert isinstance(train, DataLoader) and train.batch_size == 2

    by_hand = ImageFolder(str(root), transform=ResNet18_Weights.DEFAULT.transforms())
    hand = DataLoader(Subset(by_hand, list(val.dataset.indices)), batch_size=2)
    for (x, y), (hx, hy) in zip(val, hand, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, hy)
    for word in ("ants", "bees", "wasps", "ResNet18_Weights.IMAGENET1K_V1", "0.2 held out"):
        assert word in text
    assert "imbalanced" not in text

    ip.run_line_magic("replace_head", "auto")
    model = ip.user_ns["model"]
    assert model.fc.out_features == 3 and model.fc.weight.requires_grad
    assert torchmagic.notebook_session().labels("model") == ("ants", "bees", "wasps")


def test_as_names_the_loaders_and_for_names_the_model(ip, tmp_path):
    root = class_folders(tmp_path / "images", {"a": 4, "b": 4})
    ip.user_ns["net"] = resnet18(num_classes=5)
    ip.user_ns["other"] = resnet18(num_classes=5)
    text = _run(ip, f"{root} --as tr,va --for net --workers 0 --size 32")
    assert isinstance(ip.user_ns["tr"], DataLoader) and isinstance(ip.user_ns["va"], DataLoader)
    assert "train_loader" not in ip.user_ns and "no known weights" in text
    assert next(iter(ip.user_ns["va"]))[0].shape[1:] == (3, 32, 32)
    ip.run_line_magic("replace_head", "net.fc")
    assert ip.user_ns["net"].fc.out_features == 2 and ip.user_ns["other"].fc.out_features == 5


def test_leaks_and_imbalance_are_shown(ip, tmp_path):
    class_folders(tmp_path / "d" / "train", {"cat": 9, "dog": 2})
    class_folders(tmp_path / "d" / "val", {"cat": 2, "dog": 2}, seed=1)
    shutil.copy(tmp_path / "d/train/dog/1.png", tmp_path / "d/val/dog/again.png")
    text = _run(ip, f"{tmp_path / 'd'} --workers 0")
    assert "imbalanced: cat has 9 training images, dog 2" in text
    assert "1 validation files have the same bytes" in text and "again.png" in text


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("{root}/nowhere", "does not exist"),
        ("{root}/flat", "has no class folders"),
        ("{root}/images --valid 1.5", "--valid"),
        ("{root}/images --valid 0.01", "leaves no validation"),
        ("{root}/images --as only_one", "two names"),
        ("{root}/images --as same,same", "two different variable names"),
        ("{root}/images --as held,va", "it holds a int"),
        ("{root}/images --for nosuch", "nosuch"),
        ("{root}/broken", "bad.png is not a readable image"),
        ("{root}/empty", "no images in"),
    ],
)
def test_every_refusal_is_one_line_and_binds_nothing(ip, tmp_path, arguments, message):
    class_folders(tmp_path / "images", {"a": 3, "b": 3})
    (tmp_path / "flat").mkdir()
    class_folders(tmp_path / "broken", {"a": 2, "b": 2})
    (tmp_path / "broken" / "a" / "bad.png").write_bytes(b"not an image")
    class_folders(tmp_path / "empty", {"a": 2})
    (tmp_path / "empty" / "b").mkdir()
    ip.user_ns["held"] = 3
    before = dict(ip.user_ns)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("load_data", arguments.format(root=tmp_path) + " --workers 0")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert "train_loader" not in ip.user_ns and "va" not in ip.user_ns
    assert ip.user_ns["held"] == 3 and set(ip.user_ns) == set(before)


def test_replace_head_without_a_count_or_data_is_one_line(ip):
    ip.user_ns["model"] = resnet18(num_classes=4)
    with pytest.raises(UsageError, match="the class count is missing"):
        ip.run_line_magic("replace_head", "auto")
    assert ip.user_ns["model"].fc.out_features == 4
