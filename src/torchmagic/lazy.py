"""Modules imported on first use, so that ``%load_ext torchmagic`` stays cheap: the render
layer (and rich with it) loads when the first magic draws, not when the extension loads."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """The module ``name``, executed only when one of its attributes is first read (at
    once when it is already imported)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:  # as an import does: ``torchmagic.render`` reads it
        setattr(sys.modules[parent], child, module)
    return module
