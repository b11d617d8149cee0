"""Shared fixtures: offline torch home, small models, a fresh IPython shell per test.

The test folders have no ``__init__.py``: this folder is on ``sys.path``, so the helper
modules beside this file import by name from any folder - ``builders`` (models,
optimizers and data several folders build alike), ``paths`` (where the repository is),
``shells`` (in-process IPython shells, emptied when discarded),
``snapshots``, ``checkpoint_helpers``, ``cuda_fakes``, ``gloo_ranks``, ``real_kernel``
(kernels and the one notebook runner) and ``completions``.

The suite runs torch on one intra-op thread unless OMP_NUM_THREADS says otherwise: its
models are small, and on a busy machine a preempted second OpenMP thread stalls every
parallel region of the first (the same tests took about five times longer with two
threads than with one under a load of 10 on two cores).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torchvision

from shells import fresh_shell

os.environ.setdefault("TORCH_HOME", tempfile.mkdtemp(prefix="torchmagic-torch-home-"))
# pytest-xdist hands its workers the controller's terminal width in COLUMNS (80 without a
# terminal): outputs are drawn as in one process, at the width of the terminal if any.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)


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
    with fresh_shell() as shell:
        yield shell
