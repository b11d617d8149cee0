"""Which integration knows an object, and the one helper that sees through every wrapper.

Every identity test ("does this scheduler drive that optimizer?", "does this object hold
the model?") compares objects with their wrappers seen through on both sides: a scheduler
built on Accelerate's ``AcceleratedOptimizer`` drives the optimizer inside it. The
integrations are imported only when an object of their library is met."""

from __future__ import annotations

import importlib
from types import ModuleType

from .classes import named, package_of

# top-level package → the integration that knows it (imported when such an object is met)
_INTEGRATIONS = {
    "accelerate": "accelerate",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "lightning_fabric": "lightning",
    "finetuning_scheduler": "lightning",
    "ignite": "ignite",
    "skorch": "skorch",
    "torch": "ema",
    "timm": "ema",
    "transformers": "transformers",
    "fastai": "fastai",
}


def integration_of(obj: object) -> ModuleType | None:
    """The integration of the library defining ``obj``'s class, if torchmagic has one."""
    name = _INTEGRATIONS.get(package_of(obj))
    return None if name is None else importlib.import_module(f"{__package__}.{name}")


def inner(obj: object) -> object:
    """``obj`` with known wrappers seen through (``AcceleratedOptimizer.optimizer``,
    ``AcceleratedScheduler.scheduler``, Lightning's ``LightningOptimizer``), wrappers of
    wrappers too."""
    for _ in range(8):  # bounded
        known = integration_of(obj)
        wraps = getattr(known, "WRAPS", {}) if known is not None else {}
        attribute = next((a for cls, a in wraps.items() if named(obj, cls)), None)
        if attribute is None:
            return obj
        obj = getattr(obj, attribute)
    return obj


def same(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are one object once every wrapper is seen through."""
    return a is b or (a is not None and inner(a) is inner(b))
