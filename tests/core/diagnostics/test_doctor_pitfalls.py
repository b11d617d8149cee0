"""Doctor checks for data, weights and head that must match, and for a loader that sets
the pace: each broken situation is built by hand and named; fixing it silences it; the
user's data and random state are left as they were."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset
from torchvision import transforms
from torchvision.models import ResNet18_Weights

from torchmagic import Session
from torchmagic.core.diagnostics.doctor import diagnose
from torchmagic.core.zoo import WeightsInfo
from torchmagic.render.doctor import doctor as render_doctor

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
TINY_WEIGHTS = WeightsInfo(
    "Tiny_Weights.V1",
    "torchvision",
    crop_size=16,
    mean=IMAGENET[0],
    std=IMAGENET[1],
    num_categories=10,
)


class Net(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        return self.fc(self.conv1(x).mean((2, 3)))


class Images(Dataset):
    """Random images; labels as an attribute only when ``declare`` says so; a random
    jitter in __getitem__ draws from torch's global generator, as augmentations do."""

    def __init__(self, labels, size=16, transform=None, classes=None, declare=False):
        torch.manual_seed(1)
        self.images = torch.rand(len(labels), 3, size, size)
        self._labels = list(labels)
        self.transform = transform
        if classes is not None:
            self.classes = classes
        if declare:
            self.targets = self._labels

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, i):
        x = self.images[i] + 0.01 * torch.rand(1)
        return (self.transform(x) if self.transform else x), self._labels[i]


def trained(model):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def found(report, check):
    return [f for f in report.findings if f.check == check]


# labels outside the head's range ------------------------------------------------------


def test_labels_beyond_the_head_from_a_batch_of_the_loader():
    ns = trained(Net(10))
    ns["train_loader"] = DataLoader(Images([0, 3, 12, 1]), batch_size=4, shuffle=True)
    rng, py = torch.get_rng_state(), random.getstate()
    (finding,) = found(diagnose(ns), "labels")
    assert torch.equal(rng, torch.get_rng_state()) and random.getstate() == py
    assert finding.severity == "error" and finding.subject == "train_loader → model.fc"
    assert "label 12" in finding.message and "10 outputs" in finding.message
    assert "device-side assert triggered" in finding.message
    assert finding.fix.startswith('tm.replace_head("model.fc", 13)')
    Session(namespace=ns).replace_head("fc", 13)
    assert found(diagnose(ns), "labels") == []


@pytest.mark.parametrize(
    "dataset",
    [
        TensorDataset(torch.rand(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 10])),
        Images([0, 1, 2, 10, 4, 5], declare=True),  # a `targets` list, as CIFAR has
        Subset(Images([0, 1, 2, 10, 4, 5], declare=True), [1, 3]),
    ],
    ids=["TensorDataset", "targets", "Subset"],
)
def test_labels_from_the_dataset_itself(dataset):
    ns = trained(Net(10))
    ns["data"] = dataset  # a dataset bound without a loader is read too
    (finding,) = found(diagnose(ns), "labels")
    assert "label 10" in finding.message and finding.subject == "data → model.fc"


def test_labels_outside_a_subset_do_not_count():
    ns = trained(Net(10))
    ns["data"] = Subset(Images([0, 1, 2, 10], declare=True), [0, 1])
    assert found(diagnose(ns), "labels") == []


def test_negative_labels_but_not_the_ignore_index():
    ns = trained(Net(10))
    ns["data"] = TensorDataset(torch.rand(3, 3, 8, 8), torch.tensor([0, -100, 2]))
    assert found(diagnose(ns), "labels") == []
    ns["data"] = TensorDataset(torch.rand(3, 3, 8, 8), torch.tensor([0, -1, 2]))
    (finding,) = found(diagnose(ns), "labels")
    assert "label -1" in finding.message


def test_one_shot_iterators_are_not_consumed():
    ns = trained(Net(10))
    batches = [(torch.rand(2, 3, 8, 8), torch.tensor([0, 50]))]
    ns["stream"] = iter(batches)
    ns["gen"] = (b for b in batches)
    assert found(diagnose(ns), "labels") == []
    assert next(ns["stream"]) is batches[0] and next(ns["gen"]) is batches[0]


# the head's class count ---------------------------------------------------------------


def test_head_size_differs_from_the_declared_classes():
    ns = trained(Net(1000))
    ns["loader"] = DataLoader(Images(range(5), classes=list("abcde")), batch_size=5)
    (finding,) = found(diagnose(ns), "classes")
    assert finding.severity == "warning" and "declares 5 classes" in finding.message
    assert "1000 outputs" in finding.message and finding.fix == 'tm.replace_head("model.fc", 5)'
    Session(namespace=ns).replace_head("fc", 5)
    assert found(diagnose(ns), "classes") == []


def test_weights_categories_no_longer_name_a_hand_made_head():
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    ns = {**trained(model), "weights": ResNet18_Weights.DEFAULT}
    (finding,) = found(diagnose(ns), "classes")
    assert finding.severity == "info" and "1000 categories" in finding.message
    assert found(diagnose(ns, replaced_heads={"model"}), "classes") == []


# normalisation and resolution against the weights -------------------------------------


def test_normalize_that_is_not_the_weights_own(resnet):
    model = resnet
    wrong = transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    ns = {**trained(model), "weights": ResNet18_Weights.DEFAULT}
    ns["loader"] = DataLoader(Images(range(2), size=224, transform=wrong), batch_size=2)
    (finding,) = found(diagnose(ns), "normalization")
    assert finding.subject == "loader → model"
    assert "mean (0.5, 0.5, 0.5)" in finding.message and "ResNet18_Weights" in finding.message
    assert "mean=[0.485, 0.456, 0.406]" in finding.fix and "weights.transforms()" in finding.fix
    ns["loader"].dataset.transform = transforms.Normalize(*IMAGENET)
    assert diagnose(ns).findings == ()


def test_the_weights_own_preset_counts_as_matching():
    ns = trained(torchvision.models.resnet18(weights=None))
    ns["loader"] = DataLoader(
        Images(range(2), size=224, transform=ResNet18_Weights.DEFAULT.transforms()),
        batch_size=2,
    )
    assert found(diagnose(ns, weights={"model": ResNet18_Weights.DEFAULT}), "normalization") == []


def test_resolution_far_from_the_crop_size():
    ns = trained(Net(10))
    ns["loader"] = DataLoader(Images(range(4), size=64), batch_size=4)
    (finding,) = found(diagnose(ns, weights={"model": TINY_WEIGHTS}), "resolution")
    assert "64×64 images" in finding.message and "16×16 crops" in finding.message
    assert "resize to about 16" in finding.fix
    ns["loader"] = DataLoader(Images(range(4), size=24), batch_size=4)  # within 2x
    assert diagnose(ns, weights={"model": TINY_WEIGHTS}).findings == ()


def test_a_loader_with_its_own_batch_sampler_is_read_as_a_batch():
    """batch_sampler= leaves the loader's batch_size None, yet it collates: the peek must
    see a batch of images (N × C × H × W), not one sample."""
    ns = trained(Net(10))
    images = Images(range(4), size=64)
    sampler = torch.utils.data.BatchSampler(range(4), batch_size=4, drop_last=False)
    ns["loader"] = DataLoader(images, batch_sampler=sampler)
    (finding,) = found(diagnose(ns, weights={"model": TINY_WEIGHTS}), "resolution")
    assert "64×64 images" in finding.message


def test_weights_only_apply_to_models_of_their_architecture():
    ns = {**trained(Net(10)), "weights": ResNet18_Weights.DEFAULT, "other": Net(10)}
    ns["loader"] = DataLoader(Images(range(2), transform=transforms.Normalize(0.5, 0.5)))
    assert diagnose(ns).findings == ()  # Net is no ResNet: ImageNet statistics do not apply


# the loader sets the pace -------------------------------------------------------------


def test_data_wait_share_and_remedies_in_order():
    ns = trained(Net(10))
    ns["train_loader"] = DataLoader(Images(range(2)))
    run = SimpleNamespace(label="fit 2", data_wait_s=6.3, wall_s=10.0)
    (finding,) = diagnose(ns, fits=[run]).findings
    assert finding.check == "data-wait" and finding.subject == "fit 2"
    assert "63% of its wall time waiting for batches" in finding.message
    fix = finding.fix
    assert (
        fix.index("num_workers=")
        < fix.index("pin_memory=True")
        < fix.index("persistent_workers=True")
        < fix.index("lighter per-sample transforms")
    )
    assert "train_loader" in fix and "pinbench measures it" in fix
    pin = SimpleNamespace(ran=True, recommend=True, speedup=2.14)
    (measured,) = diagnose(ns, fits=[run], pinbench=pin).findings
    assert "pinbench measured 2.1x faster copies" in measured.fix
    assert (
        "pin_memory"
        not in diagnose(ns, fits=[run], pinbench=SimpleNamespace(ran=True, recommend=False))
        .findings[0]
        .fix
    )
    text = str(render_doctor(diagnose(ns, fits=[run]), width=120))
    assert "data-wait" in text and "63%" in text


def test_data_wait_quiet_below_the_threshold_or_without_the_figures():
    ns = trained(Net(10))
    assert diagnose(ns, fits=[SimpleNamespace(data_wait_s=2.0, wall_s=10.0)]).findings == ()
    assert diagnose(ns, fits=[SimpleNamespace(seconds=10.0)]).findings == ()


# healthy ------------------------------------------------------------------------------


def test_a_healthy_transfer_setup_reports_nothing():
    ns = trained(Net(10))
    norm = transforms.Normalize(*IMAGENET)
    ns["train_loader"] = DataLoader(
        Images(range(10), transform=norm, classes=list("0123456789"), declare=True),
        batch_size=5,
        shuffle=True,
    )
    ns["val_data"] = TensorDataset(torch.rand(4, 3, 16, 16), torch.tensor([9, 0, 1, 2]))
    ns["weights"] = TINY_WEIGHTS  # a WeightsInfo bound by name is not an enum: ignored
    run = SimpleNamespace(label="fit 1", data_wait_s=0.5, wall_s=10.0)
    report = diagnose(ns, weights={"model": TINY_WEIGHTS}, fits=[run])
    assert report.findings == ()
