"""Shared fixtures: offline torch home, small models, a fresh IPython shell per test."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torchvision
from IPython.core.interactiveshell import InteractiveShell

os.environ.setdefault("TORCH_HOME", tempfile.mkdtemp(prefix="torchmagic-torch-home-"))


@pytest.fixture
def resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None)


@pytest.fixture
def trained(resnet):
    """resnet18 + AdamW that has taken one step, so optimizer state exists."""
    opt = torch.optim.AdamW(resnet.parameters(), lr=1e-3, weight_decay=0.05)
    resnet(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    return resnet, opt


@pytest.fixture
def ip():
    """A fresh shell with torchmagic loaded; cell errors are raised by the tests."""
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "torchmagic")
    yield shell
    InteractiveShell.clear_instance()
