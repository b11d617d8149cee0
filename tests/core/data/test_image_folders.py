"""``image_folders``: the loaders equal the ones built by hand from ``ImageFolder``, the
weights' ``transforms()`` and ``random_split``; each bad folder is one refusal; what the
folder holds (counts, imbalance, leaks) is reported."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.utils.data import DataLoader, Subset, random_split
from torchvision import transforms
from torchvision.datasets import ImageFolder
from torchvision.models import ResNet18_Weights

from image_folders import class_folders
from torchmagic import TorchMagicError
from torchmagic.core.data import transforms as pipelines
from torchmagic.data import image_folders

WEIGHTS = ResNet18_Weights.DEFAULT


def _batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def _same_batches(ours, theirs):
    assert len(ours) == len(theirs)
    for (x, y), (hx, hy) in zip(ours, theirs, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, hy)


def test_a_split_folder_equals_the_hand_built_loaders(tmp_path):
    root = class_folders(tmp_path / "images", {"cat": 9, "dog": 6, "owl": 5})
    found = image_folders(root, WEIGHTS, valid=0.25, batch=4, workers=0)

    by_hand = ImageFolder(str(root), transform=WEIGHTS.transforms())
    train, val = random_split(by_hand, [15, 5], generator=torch.Generator().manual_seed(0))
    assert list(found.train_loader.dataset.indices) == list(train.indices)
    assert list(found.val_loader.dataset.indices) == list(val.indices)
    hand_val = DataLoader(Subset(by_hand, list(val.indices)), batch_size=4)
    _same_batches(_batches(found.val_loader), _batches(hand_val))

    assert found.classes == ("cat", "dog", "owl")
    assert sum(c.train for c in found.counts) == 15 and sum(c.val for c in found.counts) == 5
    assert found.train_loader.batch_size == 4 and found.pin_memory == torch.cuda.is_available()
    # the same folder, the same split, in every session
    again = image_folders(root, WEIGHTS, valid=0.25, batch=4, workers=0)
    assert list(again.val_loader.dataset.indices) == list(val.indices)


def test_train_and_val_folders_are_kept_as_given(tmp_path):
    class_folders(tmp_path / "images" / "train", {"cat": 4, "dog": 3})
    class_folders(tmp_path / "images" / "val", {"cat": 2, "dog": 2}, seed=1)
    found = image_folders(tmp_path / "images", WEIGHTS, batch=3, workers=0)

    hand_val = DataLoader(
        ImageFolder(str(tmp_path / "images" / "val"), transform=WEIGHTS.transforms()),
        batch_size=3,
    )
    _same_batches(_batches(found.val_loader), _batches(hand_val))
    assert found.presplit and [(c.train, c.val) for c in found.counts] == [(4, 2), (3, 2)]
    assert found.train_loader.dataset.root == str(tmp_path / "images" / "train")


def test_training_augments_at_the_weights_size_and_normalisation(tmp_path):
    root = class_folders(tmp_path / "images", {"a": 5, "b": 5})
    found = image_folders(root, WEIGHTS, workers=0)
    steps = found.train_loader.dataset.dataset.transform.transforms
    crop = next(t for t in steps if isinstance(t, transforms.RandomResizedCrop))
    norm = next(t for t in steps if isinstance(t, transforms.Normalize))
    preset = WEIGHTS.transforms()
    assert list(crop.size) == [preset.crop_size[0]] * 2
    assert list(norm.mean) == list(preset.mean) and list(norm.std) == list(preset.std)
    assert any(isinstance(t, transforms.RandomHorizontalFlip) for t in steps)
    x, _ = next(iter(found.train_loader))
    assert x.shape[1:] == (3, 224, 224)


def test_without_weights_imagenet_normalisation_is_used_and_said(tmp_path):
    root = class_folders(tmp_path / "images", {"a": 5, "b": 5})
    found = image_folders(root, workers=0, size=32)
    assert found.pipelines.source is None
    assert found.pipelines.mean == pipelines.IMAGENET_MEAN and found.pipelines.size == 32
    x, _ = next(iter(found.val_loader))
    assert x.shape[1:] == (3, 32, 32)


def test_leaks_and_imbalance_are_reported_by_name(tmp_path):
    class_folders(tmp_path / "d" / "train", {"cat": 9, "dog": 3})
    class_folders(tmp_path / "d" / "val", {"cat": 2, "dog": 2}, seed=1)
    shutil.copy(tmp_path / "d/train/cat/4.png", tmp_path / "d/val/cat/copy.png")
    found = image_folders(tmp_path / "d", workers=0)
    assert found.leaks == (
        (str(tmp_path / "d/train/cat/4.png"), str(tmp_path / "d/val/cat/copy.png")),
    )
    large, small = found.imbalance
    assert (large.name, large.train, small.name, small.train) == ("cat", 9, "dog", 3)

    balanced = image_folders(class_folders(tmp_path / "e", {"a": 5, "b": 4}), workers=0)
    assert balanced.leaks == () and balanced.imbalance is None


def _refusal(match, path, **options):
    with pytest.raises(TorchMagicError, match=match) as info:
        image_folders(path, workers=0, **options)
    assert "\n" not in str(info.value)
    return info.value


def test_each_bad_folder_is_one_line(tmp_path):
    assert _refusal("does not exist", tmp_path / "nowhere").param == "path"
    (tmp_path / "file.png").write_bytes(b"x")
    _refusal("is a file, not a folder", tmp_path / "file.png")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(b"x")
    _refusal("has no class folders", tmp_path / "flat")
    root = class_folders(tmp_path / "images", {"cat": 3})
    (root / "dog").mkdir()
    _refusal(r"no images in .*images/dog/", root)
    class_folders(tmp_path / "half" / "train", {"cat": 3})
    _refusal("has train/ but no val/", tmp_path / "half")
    class_folders(tmp_path / "odd" / "train", {"cat": 3, "dog": 3})
    class_folders(tmp_path / "odd" / "val", {"cat": 3, "owl": 3})
    _refusal("only one has dog, owl", tmp_path / "odd")


def test_a_bad_fraction_or_a_corrupt_image_is_one_line(tmp_path):
    root = class_folders(tmp_path / "images", {"cat": 3, "dog": 3})
    for bad in (0, 1, 1.5, -0.1, True):
        assert _refusal("between 0 and 1", root, valid=bad).param == "valid"
    assert _refusal("leaves no validation", root, valid=0.01).param == "valid"
    _refusal("batch must be a positive integer", root, batch=0)
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    _refusal(r"broken\.png is not a readable image", root)
