"""One line naming the machine and versions, printed at the top of every benchmark."""

from __future__ import annotations

import os
import platform

import torch
import torchvision

import torchmagic
from torchmagic.core.devices.hostmem import cpu_name


def describe() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = torch.get_num_threads()
    return (
        f"{cpu_name()}, {cores} cores usable, torch {torch.__version__} "
        f"({threads} thread{'s' if threads != 1 else ''}), torchvision {torchvision.__version__}, "
        f"torchmagic {torchmagic.__version__}, Python {platform.python_version()}"
    )
