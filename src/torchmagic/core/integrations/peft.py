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

import contextlib
import sys
import warnings
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..errors import TorchMagicError
from ..options import LoraOptions
from .classes import package_of

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

# The torch layer types LoRA adapts here (peft's tuner layers for them); transformers'
# ``Conv1D`` too, when transformers is imported (:func:`adaptable`).
ADAPTABLE = (nn.Linear, nn.Conv2d, nn.Embedding)
KINDS = "Linear, Conv1D, Conv2d or Embedding"


def _conv1d_class() -> type | None:
    """transformers' ``Conv1D`` (GPT-2's Linear with its weight stored in x out), if that
    module is imported; a model holding one has imported it."""
    owner = sys.modules.get("transformers.pytorch_utils")
    cls = getattr(owner, "Conv1D", None) if owner is not None else None
    return cls if isinstance(cls, type) else None


def is_conv1d(module: object) -> bool:
    cls = _conv1d_class()
    return cls is not None and isinstance(module, cls)


def is_quantized(module: nn.Module) -> bool:
    """A bitsandbytes 4-bit / 8-bit layer (a Linear subclass whose weight is packed):
    peft adapts it with its own quantized layers, which only ``get_peft_model`` picks."""
    weight = getattr(module, "weight", None)
    return any(package_of(obj) == "bitsandbytes" for obj in (module, weight))


def adaptable(module: object) -> bool:
    """Whether peft's LoRA adapts this layer type: Linear, Conv2d, Embedding, Conv1D."""
    return isinstance(module, ADAPTABLE) or is_conv1d(module)


def load() -> ModuleType:
    """peft itself, imported now (only a LoRA command needs it). In a kernel without
    ipywidgets, the tqdm.auto that peft imports warns "IProgress not found" in pink on
    the first %lora: a warning about widgets no torchmagic output uses, so it is hidden."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="IProgress not found")
            import peft
    except ImportError:
        raise TorchMagicError("LoRA needs peft, which is not installed: pip install peft") from None
    return peft


def is_lora_layer(module: object) -> bool:
    return _is(module, "peft.tuners.lora.layer", "LoraLayer")


def lora_layers(
    model: nn.Module, named: Iterable[tuple[str, nn.Module]] | None = None
) -> list[tuple[str, Any]]:
    """The LoRA layers of ``model`` by qualified name (none without peft imported);
    ``named``: the model's modules by name, when the caller has walked it already."""
    if _peft() is None:
        return []
    modules = model.named_modules() if named is None else named
    return [(name, m) for name, m in modules if is_lora_layer(m)]


def adapter_name(model: nn.Module, named: Iterable[tuple[str, nn.Module]] | None = None) -> str:
    """The adapter new LoRA layers belong to: the active one of the model's existing
    LoRA layers (a PeftModel's), else peft's ``default``; ``named`` as for
    :func:`lora_layers`."""
    for _, layer in lora_layers(model, named):
        active = layer.active_adapters
        if active:
            return active[0]
    return "default"


def make_lora_layer(base: nn.Module, adapter: str, options: LoraOptions) -> nn.Module:
    """peft's LoRA layer around ``base`` (a Linear, Conv1D, Conv2d or Embedding), made as
    ``get_peft_model`` makes it; B (an Embedding's A) starts at zero: same outputs. A
    Conv1D goes through peft's Linear layer with ``fan_in_fan_out`` (its weight is
    stored in x out) and stays the base layer, so a merge gives it back."""
    peft = load()
    from peft.tuners.lora import layer
    from peft.tuners.tuners_utils import cast_adapter_dtype

    conv1d = is_conv1d(base)
    config = peft.LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        use_dora=options.use_dora,
        use_rslora=options.use_rslora,
        fan_in_fan_out=conv1d,
    )
    kwargs: dict[str, Any] = {"r": options.r, "lora_alpha": options.alpha}
    if conv1d:
        kwargs["is_target_conv_1d_layer"] = True
        cls: Any = layer.Linear
    else:
        kinds = (
            (nn.Linear, layer.Linear),
            (nn.Conv2d, layer.Conv2d),
            (nn.Embedding, layer.Embedding),
        )
        cls = next(lora for kind, lora in kinds if isinstance(base, kind))
    # peft makes the adapters on the CPU, then moves them to the base layer's device; on
    # the meta device (a 70B-shaped model) they are made there: no memory, no arithmetic
    on_meta = any(p.is_meta for p in base.parameters(recurse=False))
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        made = cls(base, adapter, config=config, **kwargs)
    # as get_peft_model does: adapters of a bf16 / fp16 layer train in float32
    cast_adapter_dtype(made, adapter_name=adapter, autocast_adapter_dtype=True)
    return made


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
    channels, a transformers ``Conv1D``'s ``nx``/``nf`` (GPT-2's projections, weight
    stored (in, out)); a LoRA layer has its base layer's; None for other layers."""
    if isinstance(module, nn.Module):
        own = module.__dict__
        read = _width_attributes(type(module), side)
    else:
        own, read = {}, tuple((attr, True) for attr in _WIDTH_ATTRIBUTES[side])
    for attr, on_class in read:
        value = getattr(module, attr, None) if on_class else own.get(attr)
        if isinstance(value, int):
            return value
    return None


_WIDTH_ATTRIBUTES = {
    side: (f"{side}_features", f"{side}_channels", conv1d)
    for side, conv1d in (("in", "nx"), ("out", "nf"))
}
_BY_CLASS: dict[tuple[type, str], tuple[tuple[str, bool], ...]] = {}


def _width_attributes(cls: type, side: str) -> tuple[tuple[str, bool], ...]:
    """The width attributes to read on a module of ``cls``, each with whether its class
    defines it (a property, read with getattr). Any other lives in the instance's
    ``__dict__`` or, being a parameter, buffer or child, is no int: reading ``__dict__``
    spares the AttributeError a module raises for a missing name, most of the cost of
    reading every module of a model. Known once per class."""
    key = (cls, side)
    found = _BY_CLASS.get(key)
    if found is None:
        found = _BY_CLASS[key] = tuple((a, hasattr(cls, a)) for a in _WIDTH_ATTRIBUTES[side])
    return found


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
