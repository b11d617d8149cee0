"""The class names a session keeps for each model, from every source (labels=, the
weights' categories, an ImageFolder's classes, a config's id2label), used by evaluate and
predict, undone with the head and kept by save / resume."""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision
import transformers
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision import transforms
from torchvision.datasets import ImageFolder

import torchmagic
from torchmagic import Session
from torchmagic.core.zoo import LoadedModel

NAMES = ["ant", "bee", "cow"]


def test_labels_on_a_torchvision_model_are_kept_and_undone():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    session = Session(model)
    assert session.labels() is None
    session.replace_head("fc", labels=NAMES)
    assert model.fc.out_features == 3 and session.labels() == tuple(NAMES)
    data = DataLoader(TensorDataset(torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2] * 2)), 3)
    ev = session.evaluate(data, worst=2)
    assert ev.labels == tuple(NAMES) and [r.label for r in ev.per_class] == NAMES
    assert session.predict(torch.randn(3, 32, 32)).labels[0] in NAMES
    session.replace_head("fc", 3)  # a new head without names: the old ones do not fit it
    assert session.labels() is None
    assert session.evaluate(data).labels == ("0", "1", "2")
    session.undo()
    assert session.labels() == tuple(NAMES)
    session.undo()
    assert session.labels() is None and model.fc.out_features == 1000


def test_the_weights_categories_name_the_classes_while_they_fit():
    model = nn.Sequential(nn.Linear(4, 3))
    session = Session(namespace={"model": model})
    session.loaded["model"] = LoadedModel(
        model, "tiny", "torchvision", None, None, ("x", "y", "z"), None
    )
    data = DataLoader(TensorDataset(torch.randn(4, 4), torch.tensor([0, 1, 2, 0])), 2)
    assert session.labels() == ("x", "y", "z")
    assert session.evaluate(data).labels == ("x", "y", "z")
    session.replace_head("0", 2)  # two classes now: three categories name none of them
    two = DataLoader(TensorDataset(torch.randn(4, 4), torch.tensor([0, 1, 1, 0])), 2)
    assert session.evaluate(two).labels == ("0", "1")


def test_an_image_folders_classes_and_its_files(tmp_path: Path):
    for name in NAMES:
        (tmp_path / name).mkdir()
        for i in range(2):
            Image.new("RGB", (4, 4), color=(40 * i, 80, 120)).save(tmp_path / name / f"{i}.png")
    dataset = ImageFolder(str(tmp_path), transform=transforms.ToTensor())
    subset = torch.utils.data.Subset(dataset, [5, 0, 3])  # through a Subset too
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 3))
    ev = Session(model).evaluate(DataLoader(subset, batch_size=2), worst=3)
    assert ev.labels == tuple(NAMES)
    paths = {w.index: Path(w.path).relative_to(tmp_path).as_posix() for w in ev.worst}
    assert paths == {0: "cow/1.png", 1: "ant/0.png", 2: "bee/1.png"}
    shuffled = DataLoader(subset, batch_size=2, shuffle=True)
    assert all(w.path is None for w in Session(model).evaluate(shuffled, worst=3).worst)


def test_a_hugging_face_config_names_its_classes():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        id2label={0: "neg", 1: "pos"},
        label2id={"neg": 0, "pos": 1},
    )
    model = transformers.BertForSequenceClassification(config)
    session = Session(model)
    assert session.labels() == ("neg", "pos")
    batches = [{"input_ids": torch.randint(0, 50, (4, 6)), "labels": torch.tensor([0, 1, 1, 0])}]
    assert session.evaluate(batches).labels == ("neg", "pos")
    session.replace_head("auto", labels=["bad", "ok", "great"])
    assert session.labels() == ("bad", "ok", "great")
    assert model.config.id2label == {0: "bad", 1: "ok", 2: "great"}


def test_save_and_resume_keep_the_names(tmp_path: Path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = Session(model, optimizer)
    session.replace_head("auto", labels=NAMES)
    session.save(tmp_path / "run.pt")
    fresh = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5))
    resumed = torchmagic.resume(
        tmp_path / "run.pt", fresh, torch.optim.SGD(fresh.parameters(), lr=0.1)
    )
    assert resumed.labels() == tuple(NAMES)
