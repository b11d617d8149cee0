"""Small, offline helpers for the torchmagic quickstart.

The quickstart needs a transfer-learning story that runs anywhere without downloading
anything: scikit-learn ships the 8x8 ``digits`` data set, so we pretrain a small-input
ResNet-18 on digits 0-4 (the "source" task) and fine-tune it on a few labelled examples
of digits 5-9 (the "target" task). Everything is seeded so that a test can rely on it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIZE = 32  # upsampled side length; big enough for a ResNet stem, small enough for CPUs
SOURCE_CLASSES = (0, 1, 2, 3, 4)
TARGET_CLASSES = (5, 6, 7, 8, 9)


@dataclass(frozen=True)
class DigitsSplits:
    """The three data sets of the quickstart, as tensors (images N x 3 x 32 x 32)."""

    pretrain: TensorDataset  # all digits 0-4, labels 0-4
    train: TensorDataset  # K examples of each digit 5-9, labels remapped to 0-4
    test: TensorDataset  # every other digit 5-9, labels remapped to 0-4


def _to_images(flat: torch.Tensor) -> torch.Tensor:
    """8x8 grey values in [0, 16] -> 3 x 32 x 32 in [0, 1], the shape an RGB CNN expects."""
    x = (flat / 16.0).reshape(-1, 1, 8, 8)
    x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    return x.clamp_(0.0, 1.0).repeat(1, 3, 1, 1)


def load_digits_splits(k: int = 10, seed: int = 0) -> DigitsSplits:
    """Split scikit-learn's digits into a source task (0-4) and a K-shot target task (5-9).

    Normalisation uses statistics of the source data only, as it would with a real
    pretrained network whose preprocessing is fixed before the target task is seen.
    """
    bunch = load_digits()
    images = _to_images(torch.as_tensor(bunch.data, dtype=torch.float32))
    labels = torch.as_tensor(bunch.target, dtype=torch.long)

    source = labels < len(SOURCE_CLASSES)
    mean, std = images[source].mean(), images[source].std()
    images = (images - mean) / std

    generator = torch.Generator().manual_seed(seed)
    train_idx: list[torch.Tensor] = []
    test_idx: list[torch.Tensor] = []
    for digit in TARGET_CLASSES:
        idx = torch.nonzero(labels == digit).flatten()
        idx = idx[torch.randperm(len(idx), generator=generator)]
        if len(idx) <= k:
            raise ValueError(f"k={k} leaves no test examples of digit {digit}")
        train_idx.append(idx[:k])
        test_idx.append(idx[k:])
    train, test = torch.cat(train_idx), torch.cat(test_idx)
    offset = TARGET_CLASSES[0]
    return DigitsSplits(
        pretrain=TensorDataset(images[source], labels[source]),
        train=TensorDataset(images[train], labels[train] - offset),
        test=TensorDataset(images[test], labels[test] - offset),
    )


def make_loader(
    dataset: TensorDataset, batch_size: int = 32, shuffle: bool = True, seed: int = 0
) -> DataLoader:
    """A DataLoader with its own seeded generator, so batch order is reproducible."""
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)


def train(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    verbose: bool = True,
) -> list[float]:
    """A deliberately plain training loop: whatever the magics do must survive it.

    Returns the mean training loss of each epoch. The scheduler (if any) steps once per
    epoch.
    """
    loss_fn = nn.CrossEntropyLoss()
    history: list[float] = []
    for epoch in range(epochs):
        model.train()
        total, count = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            count += len(y)
        if scheduler is not None:
            scheduler.step()
        history.append(total / count)
        if verbose:
            print(f"epoch {epoch + 1}/{epochs}  loss {history[-1]:.4f}")
    return history


@torch.no_grad()
def accuracy(model: nn.Module, loader: DataLoader) -> float:
    """Fraction of correctly classified examples, with the model in eval mode."""
    model.eval()
    correct, count = 0, 0
    for x, y in loader:
        correct += (model(x).argmax(dim=1) == y).sum().item()
        count += len(y)
    return correct / count


def small_resnet18(num_classes: int = 5) -> nn.Module:
    """torchvision's ResNet-18 (no weights) with a stem for 32x32 inputs.

    The 7x7/stride-2 conv and the max-pool would shrink a 32x32 digit to 8x8 before the
    first residual block; a 3x3/stride-1 conv and no pooling keep the detail. Attribute
    names (``conv1``, ``layer1``..``layer4``, ``fc``) stay those of torchvision.
    """
    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def bf16_is_fast() -> bool:
    """Whether bf16 autocast can speed up training on this CPU.

    oneDNN has bf16 kernels for CPUs with AVX-512 (fastest with AVX512-BF16 or AMX). On
    other CPUs torch emulates bf16, and a training step of the quickstart's network takes
    tens of times longer than in fp32, so there the quickstart stays in fp32.
    """
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):  # a torch build without the check: assume not
        return False


def pretrained_resnet18(
    cache: Path, epochs: int = 2, seed: int = 0, verbose: bool = True
) -> nn.Module:
    """Stand-in for ``ResNet18_Weights.DEFAULT``: a small ResNet-18 trained on digits 0-4.

    Training takes about a minute on two CPU cores (fp32); the state_dict is cached under
    ``cache`` (the file name encodes the settings) and reused on later runs.
    """
    cache = Path(cache)
    path = cache / f"resnet18_digits0-4_e{epochs}_s{seed}.pt"
    # A private RNG stream: the caller's random state (and so, e.g., the init of a new
    # head) must not depend on whether the weights came from the cache.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = small_resnet18(num_classes=len(SOURCE_CLASSES))
        if path.exists():
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            if verbose:
                print(f"loaded pretrained weights from {path}")
        else:
            _pretrain(model, epochs, seed, verbose)
            cache.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            torch.save(model.state_dict(), tmp)
            os.replace(tmp, path)  # atomic: concurrent runs never read a half-written file
    return model.eval()


def _pretrain(model: nn.Module, epochs: int, seed: int, verbose: bool) -> None:
    """Train on all of digits 0-4 with a one-cycle schedule (fast, stable from scratch)."""
    data = load_digits_splits(seed=seed).pretrain
    loader = make_loader(data, batch_size=32, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=2e-3, total_steps=epochs * len(loader)
    )
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    correct = 0  # in the last epoch, as it trains: a second pass would cost a third more
    for epoch in range(epochs):
        model.train()
        for batch, (x, y) in enumerate(loader, start=1):
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            if epoch == epochs - 1:
                correct += int((out.argmax(dim=1) == y).sum())
            loss.backward()
            optimizer.step()
            scheduler.step()  # one-cycle steps per batch, unlike the quickstart's cosine
            if verbose and (batch % 10 == 0 or batch == len(loader)):
                print(  # a first run takes a minute: show that it moves
                    f"pretraining: epoch {epoch + 1}/{epochs}, batch {batch}/{len(loader)}, "
                    f"loss {loss.item():.3f}, {time.perf_counter() - start:.0f}s",
                    flush=True,
                )
    seconds = time.perf_counter() - start
    if verbose:
        print(
            f"pretrained on {len(data)} images of digits 0-4 in {seconds:.0f}s "
            f"(train accuracy in the last epoch {correct / len(data):.3f})"
        )
