"""CUDA as a test wants it, the same on machines with and without a GPU.

``no_cuda`` makes torch report no GPU (the "machine without CUDA" paths). ``fake_cuda``
makes it report fake GPUs with every query torchmagic makes answered by the fake (also the
ones a real GPU would answer), and turns any real CUDA initialisation during the test into
an error: a fake-device test never reaches a real device. ``auto_device`` is what ``auto``
means on this machine. Whether loading the extension initialises CUDA is checked in a
fresh process (``cuda_initialised_after``): in the test process an earlier GPU test, or
any Adam step (torch's graph-capture check), may have initialised it already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import torchmagic

GiB = 2**30


def gpu(name: str = "Fake A100", major: int = 8, minor: int = 0, sms: int = 108) -> SimpleNamespace:
    """What ``torch.cuda.get_device_properties`` returns, for the fields torchmagic reads."""
    return SimpleNamespace(
        name=name, major=major, minor=minor, multi_processor_count=sms, total_memory=40 * GiB
    )


def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reports no CUDA device and no MPS for the rest of the test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None:
        monkeypatch.setattr(mps, "is_available", lambda: False)


def _real_cuda(*args: object, **kwargs: object) -> None:
    raise AssertionError("a fake-CUDA test reached real CUDA")


def fake_cuda(
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[SimpleNamespace] | None = None,
    free: int = 10 * GiB,
    total: int = 40 * GiB,
) -> None:
    """torch reports ``gpus`` (default: one fake A100), fresh (not initialised, nothing
    allocated), with ``free`` of ``total`` bytes each; real CUDA calls fail the test."""
    gpus = gpus if gpus is not None else [gpu()]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: gpus[_index(i)])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: gpus[_index(i)].name)
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda *a, **k: all(g.major >= 8 for g in gpus)
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=None: (free, total))
    for counter in (
        "memory_allocated",
        "memory_reserved",
        "max_memory_allocated",
        "max_memory_reserved",
    ):
        monkeypatch.setattr(torch.cuda, counter, lambda i=None: 0)
    monkeypatch.setattr(torch.cuda, "_lazy_init", _real_cuda)
    monkeypatch.setattr(torch.cuda, "synchronize", _real_cuda)


def _index(device: object) -> int:
    if isinstance(device, torch.device):
        return device.index or 0
    return int(device) if device is not None else 0  # type: ignore[call-overload]


def auto_device() -> torch.device:
    """What ``auto`` resolves to on this machine: cuda, else mps, else cpu."""
    if torch.cuda.is_available():
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        return torch.device("cuda", index)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps", 0)
    return torch.device("cpu")


def cuda_initialised_after(source: str) -> bool:
    """Run ``source`` in a fresh Python process; whether CUDA was initialised after it.

    The process imports this torchmagic (the same package the tests import)."""
    script = f"{source}\nimport torch\nprint('CUDA-INITIALISED', torch.cuda.is_initialized())\n"
    env = dict(os.environ)
    package_root = str(Path(torchmagic.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("CUDA-INITIALISED")][-1]
    return line.endswith("True")
