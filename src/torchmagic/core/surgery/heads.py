"""Finding a model's classification head and building its replacement.

Detection follows the naming conventions of torchvision (and most of timm / Hugging Face
vision models): ``fc``, ``classifier`` (a layer, or the last layer of a Sequential),
``heads.head``, ``head``; then a model whose last parametrised layer is a Linear (a plain
Sequential). Anything else is refused with the candidate Linear layers listed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..devices.hostmem import machine_memory
from ..errors import TorchMagicError

HEAD_PATHS = ("fc", "classifier", "heads.head", "head", "heads", "last_linear")
AUX_HEAD_PATHS = ("aux1.fc2", "aux2.fc2", "AuxLogits.fc")
HEAD_TYPES = (nn.Linear, nn.Conv2d)
# More classes than the largest label sets in use (extreme classification) is a typo.
MAX_CLASSES = 1_000_000


@dataclass(frozen=True)
class Head:
    """A head layer at its qualified name (relative to the searched root)."""

    name: str
    module: nn.Module

    @property
    def in_features(self) -> int:
        m = self.module
        return m.in_features if isinstance(m, nn.Linear) else m.in_channels

    @property
    def out_features(self) -> int:
        m = self.module
        return m.out_features if isinstance(m, nn.Linear) else m.out_channels


def _lookup(root: nn.Module, path: str) -> nn.Module | None:
    module: nn.Module | None = root
    for part in path.split("."):
        module = module._modules.get(part) if module is not None else None
    return module


def _last_head_layer(module: nn.Module, prefix: str) -> Head | None:
    """The last Linear / Conv2d inside ``module`` in registration order."""
    found = None
    for name, sub in module.named_modules(prefix=prefix):
        if isinstance(sub, HEAD_TYPES):
            found = Head(name, sub)
    return found


def _last_parametrised_is_linear(root: nn.Module) -> Head | None:
    last = None
    for name, sub in root.named_modules():
        if any(True for _ in sub.parameters(recurse=False)):
            last = (name, sub)
    if last is not None and isinstance(last[1], nn.Linear):
        return Head(*last)
    return None


def find_head(root: nn.Module, *, named: bool = False) -> Head:
    """The classification head inside ``root``, or a clear refusal listing candidates.

    ``named``: the user pointed at this sub-tree (``model.classifier``), so its last
    Linear / Conv2d is the head whatever the naming conventions say.
    """
    if isinstance(root, HEAD_TYPES):
        return Head("", root)
    if named:
        head = _last_head_layer(root, "")
        if head is None:
            raise TorchMagicError(
                f"that is a {type(root).__name__} with no Linear or Conv2d inside: "
                "torchmagic replaces Linear and Conv2d heads"
            )
        return head
    for path in HEAD_PATHS:
        module = _lookup(root, path)
        if module is not None:
            head = _last_head_layer(module, path)
            if head is not None:
                return head
    head = _last_parametrised_is_linear(root)
    if head is not None:
        return head
    linears = [
        f"{n} ({m.in_features}→{m.out_features})"
        for n, m in root.named_modules()
        if isinstance(m, nn.Linear)
    ]
    if not linears:
        raise TorchMagicError(
            f"no head found in {type(root).__name__}: it has no Linear layer; "
            "name the layer to replace, e.g. %replace_head model.classifier 10"
        )
    shown = ", ".join(linears[-8:])
    raise TorchMagicError(
        f"cannot tell which layer is the head of {type(root).__name__}; candidates: {shown}. "
        "Name one, e.g. %replace_head model.<name> 10"
    )


def aux_heads(root: nn.Module) -> list[Head]:
    """Auxiliary classifiers (GoogLeNet's aux1/aux2, Inception v3's AuxLogits)."""
    return [
        Head(path, module)
        for path in AUX_HEAD_PATHS
        if isinstance(module := _lookup(root, path), HEAD_TYPES)
    ]


def _free_bytes(device: torch.device) -> int | None:
    """Memory a new tensor could take on ``device`` now; None where unknown."""
    if device.type == "cpu":
        return machine_memory()[0]
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return None


def check_size(old: nn.Linear | nn.Conv2d, num_classes: int) -> None:
    """Refuse a class count beyond :data:`MAX_CLASSES`, or whose new weight would not fit
    in the memory free on the old head's device, before anything is allocated."""
    if num_classes > MAX_CLASSES:
        raise TorchMagicError(
            f"num_classes={num_classes} is more than {MAX_CLASSES:,} classes", param="num_classes"
        )
    weight = old.weight
    per_class = weight[0].numel() + (1 if getattr(old, "bias", None) is not None else 0)
    needed = per_class * num_classes * weight.element_size()
    free = _free_bytes(weight.device)
    if free is not None and needed > free:
        raise TorchMagicError(
            f"num_classes={num_classes}: the new head needs {needed / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB is free on {weight.device}",
            param="num_classes",
        )


def build_head(old: nn.Module, num_classes: int, dropout: float | None = None) -> nn.Module:
    """A fresh layer with ``old``'s input size, device, dtype, bias and mode."""
    if isinstance(old, HEAD_TYPES):
        check_size(old, num_classes)
    weight = old.weight
    factory = {"device": weight.device, "dtype": weight.dtype}
    if isinstance(old, nn.Linear):
        new: nn.Module = nn.Linear(
            old.in_features, num_classes, bias=old.bias is not None, **factory
        )
    elif isinstance(old, nn.Conv2d):
        if old.groups != 1:
            raise TorchMagicError("cannot replace a grouped Conv2d head; name a plain layer")
        new = nn.Conv2d(
            old.in_channels,
            num_classes,
            old.kernel_size,
            stride=old.stride,
            padding=old.padding,
            dilation=old.dilation,
            bias=old.bias is not None,
            padding_mode=old.padding_mode,
            **factory,
        )
    else:
        raise TorchMagicError(
            f"the head is a {type(old).__name__}; torchmagic replaces Linear and Conv2d heads"
        )
    if dropout is not None:
        new = nn.Sequential(nn.Dropout(dropout), new)
    return new.train(old.training)
