"""Which integration knows an object, the one helper that sees through every wrapper, and
where an optimizer keeps its state.

Every identity test ("does this scheduler drive that optimizer?", "does this object hold
the model?") compares objects with their wrappers seen through on both sides: a scheduler
built on Accelerate's ``AcceleratedOptimizer`` drives the optimizer inside it. Every read
or write of an optimizer's per-parameter state goes through :func:`state_of`, which finds
the state where an optimizer that steps another keeps it. The integrations are imported
only when an object of their library is met."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

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


def _through(obj: object, table: str) -> object:
    """``obj`` followed through the attributes its integration's ``table`` (class name →
    attribute) names, again and again (bounded)."""
    for _ in range(8):
        known = integration_of(obj)
        attributes = getattr(known, table, {}) if known is not None else {}
        attribute = next((a for cls, a in attributes.items() if named(obj, cls)), None)
        if attribute is None:
            return obj
        obj = getattr(obj, attribute)
    return obj


def inner(obj: object) -> object:
    """``obj`` with known wrappers seen through (``AcceleratedOptimizer.optimizer``,
    ``AcceleratedScheduler.scheduler``, Lightning's ``LightningOptimizer``), wrappers of
    wrappers too."""
    return _through(obj, "WRAPS")


def state_holder(optimizer: object) -> Any:
    """The optimizer whose ``state`` holds ``optimizer``'s per-parameter state: itself,
    or the base optimizer that an optimizer stepping another keeps it in (timm's
    ``Lookahead``: the moments and the slow weights live in ``_base_optimizer.state``,
    its own ``state`` stays empty; both share one ``param_groups`` list). It is not a
    wrapper seen through: stepping the base alone would skip the lookahead."""
    return _through(optimizer, "STATE_IN")


def state_of(optimizer: object) -> Any:
    """``optimizer``'s per-parameter state, where it really lives (see :func:`state_holder`);
    read it again after a ``load_state_dict``, which replaces the dict."""
    return state_holder(optimizer).state


def same(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are one object once every wrapper is seen through."""
    return a is b or (a is not None and inner(a) is inner(b))
