"""``Session.load_data``: the loaders bound by name, the folder's classes kept for the model
and sizing ``replace_head`` without a count; a refusal binds nothing."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
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


def test_a_size_given_to_load_data_is_what_predict_and_the_export_use(tmp_path):
    """Weights made for 224 pixels, data loaded at 32: predictions and the exported file's
    preprocessing follow the 32-pixel transforms the model was trained with."""
    import json

    from safetensors import safe_open
    from torchvision import transforms

    from torchmagic.core.zoo import LoadedModel, WeightsInfo

    root = class_folders(tmp_path / "images", {"ants": 3, "bees": 3})
    torch.manual_seed(0)
    model = resnet18(num_classes=2)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    weights_preset = transforms.Compose(
        [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]
    )
    info = WeightsInfo(
        "Stand_In.TEST", "torchvision", crop_size=224, resize_size=256, mean=mean, std=std
    )
    namespace = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    tm = Session(namespace=namespace)
    tm.loaded["model"] = LoadedModel(
        model, "resnet18", "torchvision", "w", weights_preset, None, info
    )
    found = tm.load_data(root, workers=0, size=32)
    assert found.pipelines.size == 32 and found.pipelines.resize == 37

    image = root / "ants" / "0.png"
    got = tm.predict(str(image), top=2)
    model.eval()
    with torch.no_grad():
        hand = model(found.pipelines.eval(Image.open(image).convert("RGB"))[None]).softmax(1)[0]
    assert torch.equal(torch.tensor(got.probabilities), hand.sort(descending=True).values)

    tm.export(str(tmp_path / "model.safetensors"), input_shape=(1, 3, 32, 32))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        stored = json.loads(f.metadata()["preprocessing"])
    assert stored == {"resize_size": 37, "crop_size": 32, "mean": list(mean), "std": list(std)}
