"""``Session.load_data``: the loaders bound by name, the folder's classes kept for the model
and sizing ``replace_head`` without a count; a refusal binds nothing."""

from __future__ import annotations

import pytest
import torch
from torchvision.models import resnet18

from image_folders import class_folders
from torchmagic import Session, TorchMagicError


def test_the_classes_size_the_head_of_the_model_they_were_loaded_for(tmp_path):
    root = class_folders(tmp_path / "images", {"ants": 4, "bees": 4, "wasps": 4})
    model = resnet18(num_classes=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    namespace = {"model": model, "optimizer": optimizer}
    tm = Session(namespace=namespace)
    found = tm.load_data(root, workers=0, batch=5)
    assert namespace["train_loader"] is found.train_loader and found.model == "model"
    assert namespace["val_loader"].batch_size == 5
    assert tm.class_names.given(model) == ("ants", "bees", "wasps")

    change = tm.replace_head("auto")
    assert model.fc.out_features == 3
    assert any(p is model.fc.weight for g in optimizer.param_groups for p in g["params"])
    assert tm.labels() == ("ants", "bees", "wasps")  # the new head is named by the folders
    tm.undo()
    assert model.fc.out_features == 7 and change.model_name == "model"


def test_a_refusal_binds_nothing_and_keeps_the_class_names(tmp_path):
    root = class_folders(tmp_path / "images", {"a": 3, "b": 3})
    namespace = {"model": resnet18(num_classes=2), "val_loader": 5}
    tm = Session(namespace=namespace)
    with pytest.raises(TorchMagicError, match="holds a int") as info:
        tm.load_data(root, workers=0)
    assert info.value.param == "bind"
    with pytest.raises(TorchMagicError, match="between 0 and 1"):
        tm.load_data(root, bind=("tr", "va"), valid=2.0)
    assert set(namespace) == {"model", "val_loader"}
    assert tm.class_names.given(namespace["model"]) is None


def test_without_a_model_the_loaders_are_still_built(tmp_path):
    root = class_folders(tmp_path / "images", {"a": 3, "b": 3})
    namespace: dict = {}
    found = Session(namespace=namespace).load_data(root, workers=0)
    assert found.model is None and found.pipelines.source is None
    assert set(namespace) == {"train_loader", "val_loader"}
