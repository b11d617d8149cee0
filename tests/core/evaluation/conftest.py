"""A small classifier trained for a few epochs on scikit-learn's digits (offline, seeded),
and its held-out loader: real, imperfect predictions for the evaluation tests."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digits_model() -> nn.Module:
    """8x8 grey digits → 10 classes, with BatchNorm (running statistics) and Dropout
    (random in train mode): what evaluation must not disturb."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(0.3),
        nn.Linear(8 * 8 * 8, 10),
    )


@pytest.fixture(scope="module")
def digits() -> tuple[nn.Module, TensorDataset, TensorDataset]:
    """(a model trained three epochs, the training set, the held-out set)."""
    torch.manual_seed(0)
    bunch = load_digits()
    images = torch.as_tensor(bunch.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    labels = torch.as_tensor(bunch.target, dtype=torch.long)
    train = TensorDataset(images[:1200], labels[:1200])
    held_out = TensorDataset(images[1200:], labels[1200:])
    model = digits_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = DataLoader(
        train, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    for _ in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    return model, train, held_out


@pytest.fixture
def val_loader(digits) -> DataLoader:
    return DataLoader(digits[2], batch_size=50)
