"""PEFT (``peft``): what its objects wrap, and where its adapters and trained copies live.

peft stays optional: nothing here imports it. An object can only be one of peft's when
peft has been imported already, so every question first looks in ``sys.modules``.

- ``PeftModel`` wraps a tuner (``LoraModel`` …) as ``base_model``, which wraps the user's
  model as ``model``: ``peft_model.base_model.model`` is the model, so target names are
  relative to it (``blocks.3``), and the full ``base_model.model.blocks.3`` names the same.
- ``modules_to_save`` (a head trained in full next to the adapters) puts a
  ``ModulesToSaveWrapper`` in the head's place: ``original_module`` (frozen) and one trained
  copy per adapter in ``modules_to_save``; the forward runs the active adapter's copy.
"""

from __future__ import annotations

import sys
from types import ModuleType

from torch import nn

# The attribute path from a PeftModel to the user's model.
WRAPPER_PATH = ("base_model", "model")


def _peft() -> ModuleType | None:
    return sys.modules.get("peft")


def _is(module: object, path: str, name: str) -> bool:
    """Whether ``module`` is an instance of peft's ``path.name`` (False without peft)."""
    if _peft() is None:
        return False
    owner = sys.modules.get(path)
    cls = getattr(owner, name, None) if owner is not None else None
    return isinstance(cls, type) and isinstance(module, cls)


def is_peft_model(module: object) -> bool:
    return _is(module, "peft.peft_model", "PeftModel")


def is_tuner(module: object) -> bool:
    """A tuner model (``LoraModel`` …): ``.model`` is the model it adapted."""
    return _is(module, "peft.tuners.tuners_utils", "BaseTuner")


def inner(module: nn.Module) -> nn.Module | None:
    """The module a PeftModel or a tuner wraps; None for anything else."""
    if is_peft_model(module):
        wrapped = getattr(module, "base_model", None)
    elif is_tuner(module):
        wrapped = getattr(module, "model", None)
    else:
        return None
    return wrapped if isinstance(wrapped, nn.Module) else None


def is_modules_to_save(module: object) -> bool:
    return _is(module, "peft.utils.other", "ModulesToSaveWrapper")


def _active(wrapper: nn.Module) -> str | None:
    active = getattr(wrapper, "active_adapter", None)
    if isinstance(active, (list, tuple)):
        active = active[0] if active else None
    return active if isinstance(active, str) else None


def passive_paths(module: nn.Module, prefix: str = "") -> list[str]:
    """Qualified names (under ``prefix``) of what the forward does not run inside
    ModulesToSaveWrappers: each ``original_module`` and the inactive adapters' copies."""
    if _peft() is None:
        return []
    paths = []
    for name, sub in module.named_modules(prefix=prefix):
        if not is_modules_to_save(sub):
            continue
        active = _active(sub)
        paths.append(f"{name}.original_module" if name else "original_module")
        copies = sub._modules.get("modules_to_save")
        for key in copies._modules if copies is not None else ():
            if key != active:
                paths.append(f"{name}.modules_to_save.{key}" if name else f"modules_to_save.{key}")
    return paths


def copy_wrapper(model: nn.Module, name: str) -> str | None:
    """When ``name`` is a trained copy inside a ModulesToSaveWrapper, the wrapper's
    qualified name (where the head sits for the model); else None."""
    if _peft() is None:
        return None
    wrapper_name, _, rest = name.rpartition(".modules_to_save.")
    if not wrapper_name or "." in rest:
        return None
    return wrapper_name if is_modules_to_save(model.get_submodule(wrapper_name)) else None


def original_of(model: nn.Module, name: str) -> str | None:
    """When ``name`` is the trained copy inside a ModulesToSaveWrapper, the qualified
    name of the wrapper's ``original_module`` (its frozen twin); else None."""
    wrapper_name = copy_wrapper(model, name)
    if wrapper_name is None or "original_module" not in model.get_submodule(wrapper_name)._modules:
        return None
    return f"{wrapper_name}.original_module"
