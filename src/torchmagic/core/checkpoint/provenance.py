"""Where a checkpoint was written: the Python and library versions its model's classes come
from and the zoo call that built the model, so a batch job months later can rebuild the
same setup; and the one line a resume under another torch minor version warns with."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from ..zoo import LoadedModel

# recorded only where the model's own classes come from them (a timm or Hugging Face
# model, peft's LoRA layers); torchvision always, as torch's companion
_WHERE_USED = ("timm", "transformers", "peft")


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(model: nn.Module) -> dict[str, str]:
    """Python, torch, torchvision (where installed) and each of timm / transformers / peft
    whose classes are in ``model``, by package name."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "torchvision": _installed_version("torchvision"),
    }
    packages = {type(m).__module__.partition(".")[0] for m in model.modules()}
    for package in _WHERE_USED:
        if package in packages:
            found[package] = _installed_version(package)
    return {k: v for k, v in found.items() if v is not None}


def zoo_call(loaded: LoadedModel | None, model: nn.Module) -> dict | None:
    """How ``load_model`` built ``model`` (source, name, weights), where it did; None for a
    model the user built."""
    if loaded is None or loaded.model is not model:
        return None
    weights = loaded.weights
    if weights is not None and not isinstance(weights, str):  # a torchvision WeightsEnum member
        weights = f"{type(weights).__name__}.{weights.name}"
    return {"source": loaded.source, "name": loaded.name, "weights": weights}


def _minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def torch_mismatch(payload: dict) -> str | None:
    """One line when the file was written under another torch major.minor than this one;
    None when it is the same (or the file does not say)."""
    saved = payload.get("environment", {}).get("torch", payload.get("torch"))
    here = str(torch.__version__)
    if not isinstance(saved, str) or _minor(saved) == _minor(here):
        return None
    return (
        f"written under torch {saved}, resumed under torch {here}: the states load by name, "
        "but another torch minor version may compute differently (bit for bit only under "
        f"torch {'.'.join(_minor(saved))})"
    )
