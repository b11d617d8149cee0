"""The model as it runs for inference, in a copy: the live model keeps its adapters, its
BatchNorm policies, its hooks, its history and every weight.

The copy is the real model behind any wrapper (``torch.compile``, DataParallel, a
PeftModel), on the CPU (a file that loads anywhere), in eval mode, nothing trainable,
with LoRA adapters folded into their base layers (adapters switched off are dropped, as
the live model ignores them), each FrozenBatchNorm2d of the ``frozen`` policy back as the
BatchNorm2d it stands for, and torchmagic's own hooks removed. Its modules and keys are
the plain architecture's.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..integrations import peft
from ..modules import parent_of, unwrap
from ..surgery import batchnorm

_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks")
# kept beside a hook table, by the same key
_HOOK_EXTRAS = (
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def _ours(hook: object) -> bool:
    return str(getattr(hook, "__module__", "")).partition(".")[0] == "torchmagic"


def _remove_our_hooks(model: nn.Module) -> None:
    for module in model.modules():
        for table in _HOOK_TABLES:
            hooks = getattr(module, table)
            for key in [k for k, hook in hooks.items() if _ours(hook)]:
                del hooks[key]
                for extra in _HOOK_EXTRAS:
                    getattr(module, extra, {}).pop(key, None)


def _fold_adapters(model: nn.Module) -> None:
    for name, layer in peft.lora_layers(model):
        if peft.enabled(layer):
            with torch.no_grad():
                peft.merge(layer)
        parent, attr = parent_of(model, name)
        setattr(parent, attr, peft.base_of(layer))


def _plain_batchnorms(live: nn.Module, twin: nn.Module) -> None:
    """Each stand-in of ``live`` (by name, where the swap remembers its original) as a
    plain BatchNorm2d in ``twin``."""
    for name, module in live.named_modules(remove_duplicate=False):
        if batchnorm.stands_in(module):
            parent, attr = parent_of(twin, name)
            setattr(parent, attr, batchnorm.plain_copy(module))


def inference_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` for inference (see the module's docstring)."""
    live = unwrap(model)
    twin = copy.deepcopy(live)
    _plain_batchnorms(live, twin)
    twin.to("cpu")
    _fold_adapters(twin)
    _remove_our_hooks(twin)
    twin.requires_grad_(False)
    return twin.eval()
