"""Keeping a model's own record of its classes in step with a new head.

timm models keep ``num_classes`` (``reset_classifier`` and feature wrappers read it);
Hugging Face models keep ``num_labels``, which their loss uses to reshape logits
(``labels=`` in the forward), and a config whose ``id2label`` / ``label2id`` name the
classes (``num_labels`` is derived from ``id2label``). A head swapped without them breaks the
model's own loss and saves a config that contradicts the weights. Every change is made
through the transaction, so undo restores the old values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ..errors import TorchMagicError
from ..options import class_names
from .heads import Head
from .transaction import Transaction

COUNT_ATTRIBUTES = ("num_classes", "num_labels")


def _label_config(model: nn.Module) -> Any:
    """The Hugging Face config holding the label map, or None."""
    config = getattr(model, "config", None)
    return config if isinstance(getattr(config, "id2label", None), dict) else None


def _replaces_main(heads: Sequence[Head]) -> bool:
    return any(h.role != "auxiliary" for h in heads)


def check_labels(
    model: nn.Module, heads: Sequence[Head], num_classes: int, labels: Sequence[str] | None
) -> None:
    """Refuse class names that cannot be stored, before anything changes."""
    labels = class_names(labels)
    if labels is None:
        return
    if len(labels) != num_classes:
        raise TorchMagicError(
            f"{len(labels)} labels for {num_classes} classes: give one name per class",
            param="labels",
        )
    repeated = sorted({name for name in labels if list(labels).count(name) > 1})
    if repeated:
        raise TorchMagicError(f"labels repeat {', '.join(repeated)}", param="labels")
    if not _replaces_main(heads):
        raise TorchMagicError(
            "class names go with the main head, and only auxiliary heads are replaced",
            param="labels",
        )


def _owners(model: nn.Module, heads: Sequence[Head]) -> list[nn.Module]:
    """The model and every module on the way down to a main or distillation head."""
    owners = {id(model): model}
    for head in heads:
        if head.role == "auxiliary":
            continue
        parts = head.name.split(".")
        for depth in range(1, len(parts)):
            module = model.get_submodule(".".join(parts[:depth]))
            owners.setdefault(id(module), module)
    return list(owners.values())


def sync(
    model: nn.Module,
    heads: Sequence[Head],
    num_classes: int,
    labels: Sequence[str] | None,
    tx: Transaction,
) -> list[str]:
    """Set the model's class count and label map to the new head; notes say what changed."""
    if not _replaces_main(heads):
        return []
    notes = []
    for module in _owners(model, heads):
        for attr in COUNT_ATTRIBUTES:
            value = vars(module).get(attr)
            if isinstance(value, int) and not isinstance(value, bool) and value != num_classes:
                tx.set_attr(module, attr, num_classes)
                where = f"{type(module).__name__}.{attr}"
                notes.append(f"{where}: {value} → {num_classes}")
    config = _label_config(model)
    if config is not None:
        old = config.id2label
        if labels is not None:
            id2label = dict(enumerate(labels))
        elif len(old) == num_classes:
            id2label = dict(old)
        else:
            id2label = {i: f"LABEL_{i}" for i in range(num_classes)}
        if id2label != old:
            tx.set_attr(config, "id2label", id2label)
            tx.set_attr(config, "label2id", {name: i for i, name in id2label.items()})
            shown = ", ".join(list(id2label.values())[:4]) + (", …" if num_classes > 4 else "")
            notes.append(f"config: {len(old)} labels → {num_classes} ({shown})")
    return notes
