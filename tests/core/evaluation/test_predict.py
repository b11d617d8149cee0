"""Session.predict on an image path, a folder, a PIL image and a tensor, through the
model's evaluation transforms (never the training augmentation), leaving the model and
the random state as they were."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader
from torchvision import transforms
from torchvision.datasets import ImageFolder

from torchmagic import Session
from torchmagic.core import TorchMagicError
from torchmagic.core.evaluation import Prediction, Predictions

CLASSES = ("cat", "dog", "owl")
EVAL = transforms.Compose(
    [transforms.Resize(8), transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.25] * 3)]
)
AUGMENT = transforms.Compose(
    [transforms.RandomResizedCrop(8), transforms.RandomHorizontalFlip(), transforms.ToTensor()]
)


def _images(root: Path) -> Path:
    """An ImageFolder tree of 12x12 RGB images, two per class, plus a file that is not one."""
    generator = torch.Generator().manual_seed(0)
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        for i in range(2):
            pixels = torch.randint(0, 256, (12, 12, 3), generator=generator, dtype=torch.uint8)
            Image.fromarray(pixels.numpy()).save(root / name / f"{i}.png")
    (root / "notes.txt").write_text("not an image")
    return root


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3), nn.Dropout(0.5))


def _hand(model: nn.Module, image: Image.Image) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        probabilities = model(EVAL(image)[None]).softmax(1)[0]
    model.train()
    return probabilities


@pytest.fixture
def folder(tmp_path) -> Path:
    return _images(tmp_path / "photos")


def _session(model: nn.Module, **namespace: object) -> Session:
    return Session(namespace={"model": model, **namespace})


def test_a_path_uses_the_eval_loaders_transform_and_names(folder):
    model = _model().train()
    val = DataLoader(ImageFolder(str(folder), transform=EVAL), batch_size=2)
    train = DataLoader(ImageFolder(str(folder), transform=AUGMENT), batch_size=2)
    session = _session(model, val_loader=val, train_loader=train)
    session.replace_head("1", labels=list(CLASSES))
    path = folder / "dog" / "1.png"
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    found = session.predict(str(path), top=2)
    assert isinstance(found, Prediction) and found.source == str(path)
    with Image.open(path) as opened:
        want = _hand(model, opened.convert("RGB"))
    best = want.topk(2)
    assert found.labels == tuple(CLASSES[i] for i in best.indices.tolist())
    assert found.probabilities == pytest.approx(best.values.tolist(), rel=1e-5)
    assert found.label == found.labels[0]
    assert model.training and model[2].training
    assert torch.equal(torch_state, torch.get_rng_state()) and python_state == random.getstate()


def test_a_folder_a_pil_image_and_tensors(folder):
    model = _model()
    session = _session(model, preprocess=EVAL)
    many = session.predict(str(folder), transforms="preprocess", top=3)
    assert isinstance(many, Predictions) and len(many) == 6  # notes.txt is not an image
    assert [Path(p.source).parent.name for p in many.items] == [c for c in CLASSES for _ in "ab"]
    assert all(sum(p.probabilities) == pytest.approx(1.0, rel=1e-5) for p in many.items)
    with Image.open(folder / "owl" / "0.png") as opened:
        image = opened.convert("RGB")
    one = session.predict(image, transforms=EVAL)
    assert isinstance(one, Prediction) and len(one.labels) == 3  # top 5 of 3 classes
    assert one.labels == many[4].labels
    assert one.probabilities == pytest.approx(many[4].probabilities, rel=1e-5)
    tensor = EVAL(image)
    assert session.predict(tensor).labels == one.labels  # a tensor is the model's input
    batch = session.predict(torch.stack([tensor, tensor]), top=1)
    assert (
        isinstance(batch, Predictions) and [p.labels for p in batch.items] == [one.labels[:1]] * 2
    )
    session.workspace.namespace["picture"] = image
    assert session.predict("picture", transforms=EVAL).labels == one.labels


def test_only_an_augmenting_transform_is_refused_naming_transforms(folder):
    model = _model()
    train = DataLoader(ImageFolder(str(folder), transform=AUGMENT), batch_size=2)
    session = _session(model, train_loader=train)
    with pytest.raises(
        TorchMagicError, match="only augmenting transforms .*RandomResizedCrop"
    ) as info:
        session.predict(str(folder / "cat" / "0.png"))
    assert info.value.param == "transforms"
    found = session.predict(str(folder / "cat" / "0.png"), transforms=EVAL)
    assert len(found.labels) == 3


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("missing.png", "neither a variable nor a file or folder"),
        ("1" * 5000, "cannot look up '1{57}…': File name too long"),
        ([1, 2], "input must be an image path, a folder of images, a PIL image or a tensor"),
        (torch.zeros(1, 1, 1, 1, 1), "one sample or a batch"),
        (torch.zeros(4, 5), r"'model' cannot run on inputs of shape \[4, 5\]: .*mat1 and mat2"),
    ],
)
def test_bad_inputs_are_one_line(value, match):
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TorchMagicError, match=match) as info:
        _session(model).predict(value)
    assert info.value.param == "input" and "\n" not in str(info.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_an_empty_folder_and_an_image_without_transforms(tmp_path, folder):
    (tmp_path / "empty").mkdir()
    session = _session(_model())
    with pytest.raises(TorchMagicError, match="no image files in the folder"):
        session.predict(str(tmp_path / "empty"))
    with pytest.raises(TorchMagicError, match="no evaluation transforms are known"):
        session.predict(str(folder / "cat" / "0.png"))
    with pytest.raises(TorchMagicError, match="top must be a positive"):
        session.predict(torch.zeros(192), top=0)


def test_a_folder_too_large_or_unreadable_is_one_line(monkeypatch, tmp_path, folder):
    """A folder is scanned for images up to a bound (``%predict /`` is no disk scan), and a
    folder that cannot be listed is named in one line."""
    from torchmagic.core.evaluation import predict

    session = _session(_model(), tf=EVAL)
    monkeypatch.setattr(predict, "MAX_FILES", 6)  # the folder holds 7 files
    with pytest.raises(TorchMagicError, match=r"photos holds over 6 files") as info:
        session.predict(str(folder), transforms="tf")
    assert info.value.param == "input" and "\n" not in str(info.value)
    monkeypatch.setattr(predict, "MAX_FILES", 7)
    assert len(session.predict(str(folder), transforms="tf")) == 6

    def refused(path, onerror=None, **kwargs):
        onerror(PermissionError(13, "Permission denied", str(tmp_path / "locked")))
        return iter(())

    monkeypatch.setattr(predict.os, "walk", refused)
    with pytest.raises(TorchMagicError, match=r"cannot read .*locked: Permission denied"):
        session.predict(str(folder), transforms="tf")
