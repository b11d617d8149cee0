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
from typing import Any

from torch import nn

from ..errors import TorchMagicError

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


# -- LoRA layers (peft's tuner layers, made and merged here for core.surgery.lora) --------

# The layer types LoRA adapts here (peft's tuner layers for them).
ADAPTABLE = (nn.Linear, nn.Conv2d, nn.Embedding)


def load() -> ModuleType:
    """peft itself, imported now (only a LoRA command needs it)."""
    try:
        import peft
    except ImportError:
        raise TorchMagicError("LoRA needs peft, which is not installed: pip install peft") from None
    return peft


def is_lora_layer(module: object) -> bool:
    return _is(module, "peft.tuners.lora.layer", "LoraLayer")


def lora_layers(model: nn.Module) -> list[tuple[str, Any]]:
    """The LoRA layers of ``model`` by qualified name (none without peft imported)."""
    if _peft() is None:
        return []
    return [(name, m) for name, m in model.named_modules() if is_lora_layer(m)]


def adapter_name(model: nn.Module) -> str:
    """The adapter new LoRA layers belong to: the active one of the model's existing
    LoRA layers (a PeftModel's), else peft's ``default``."""
    for _, layer in lora_layers(model):
        active = layer.active_adapters
        if active:
            return active[0]
    return "default"


def make_lora_layer(
    base: nn.Module, adapter: str, r: int, alpha: float, dropout: float
) -> nn.Module:
    """peft's LoRA layer around ``base`` (a Linear, Conv2d or Embedding); B (an
    Embedding's A) starts at zero: same outputs."""
    peft = load()
    from peft.tuners.lora import layer

    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout)
    kinds = ((nn.Linear, layer.Linear), (nn.Conv2d, layer.Conv2d), (nn.Embedding, layer.Embedding))
    cls: Any = next(lora for kind, lora in kinds if isinstance(base, kind))
    return cls(base, adapter, config=config, r=r, lora_alpha=alpha, lora_dropout=dropout)


def base_of(layer: Any) -> nn.Module:
    """The layer a LoRA layer adapts (its ``base_layer``)."""
    base = layer.base_layer
    assert isinstance(base, nn.Module)
    return base


def adapter_parameters(layer: Any) -> list[nn.Parameter]:
    """A LoRA layer's own parameters: everything but its base layer's."""
    base = {id(p) for p in base_of(layer).parameters()}
    return [p for p in layer.parameters() if id(p) not in base]


def adapters_of(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of every LoRA adapter in ``model``, each once."""
    seen: set[int] = set()
    found = []
    for _, layer in lora_layers(model):
        for p in adapter_parameters(layer):
            if id(p) not in seen:
                seen.add(id(p))
                found.append(p)
    return found


def rank(layer: Any) -> int:
    """The rank of the layer's active adapter (0 when none is active)."""
    active = layer.active_adapters
    ranks = layer.r
    return int(ranks[active[0]]) if active and active[0] in ranks else 0


def merged_adapters(layer: Any) -> list[str]:
    return list(layer.merged_adapters)


def merge(layer: Any) -> None:
    """Fold the active adapters into the base weights (peft's own merge)."""
    layer.merge(adapter_names=list(layer.active_adapters))


def unmark_merged(layer: Any, merged: list[str]) -> None:
    """Set which adapters the layer counts as merged (after its weights were put back)."""
    layer.merged_adapters[:] = merged


def enabled(layer: Any) -> bool:
    return not layer.disable_adapters


def set_enabled(layer: Any, flag: bool) -> None:
    """Turn the adapters' contribution on or off; trainability stays as it is (peft's
    switch also flips the adapters' requires_grad, which the optimizer would not see)."""
    flags = [(p, p.requires_grad) for p in layer.parameters()]
    layer.enable_adapters(flag)
    for p, was in flags:
        p.requires_grad_(was)


def width(module: object, side: str) -> int | None:
    """A layer's input (``side="in"``) or output width: a Linear's features, a Conv's
    channels (a LoRA layer has its base layer's); None for other layers."""
    for attr in (f"{side}_features", f"{side}_channels"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    return None


def broken_adapters(layer: Any) -> list[str]:
    """What no longer lines up in a LoRA layer (its forward would fail): no base layer,
    or an adapter whose A does not read the base's input or whose B does not write its
    output. Empty when it is whole."""
    base = getattr(layer, "base_layer", None)
    if not isinstance(base, nn.Module):
        return ["its base layer is missing"]
    wrong = []
    for name, a in layer.lora_A.items():
        b = layer.lora_B[name] if name in layer.lora_B else None
        if width(a, "in") != width(base, "in") or width(b, "out") != width(base, "out"):
            wrong.append(
                f"adapter '{name}' ({width(a, 'in')}→{width(b, 'out')}) no longer fits its "
                f"base layer ({width(base, 'in')}→{width(base, 'out')})"
            )
    return wrong
