"""The class names of each model, from wherever the session learnt them.

Given names (``replace_head(..., labels=[...])``) are kept per model by :class:`ClassNames`,
through the command's transaction, so undo puts the previous names back and a checkpoint's
replayed head brings them again. Other sources are read when the names are needed: a
Hugging Face config's ``id2label``, a dataset's ``classes`` (``ImageFolder``), the
categories of the weights the model was loaded with. A source counts only when it names as
many classes as the model's output has.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from torch import nn

from ..surgery.transaction import Transaction
from ..training.data import base_dataset

_DEFAULT_HF_LABEL = "LABEL_"  # what transformers names classes nobody named


class ClassNames:
    """The names each model was given with ``labels=`` (weakly: a dropped model goes)."""

    def __init__(self) -> None:
        self._given: weakref.WeakKeyDictionary[nn.Module, tuple[str, ...]] = (
            weakref.WeakKeyDictionary()
        )

    def given(self, model: nn.Module) -> tuple[str, ...] | None:
        return self._given.get(model)

    def give(self, model: nn.Module, names: Sequence[str] | None, tx: Transaction) -> None:
        """``model``'s names from now on (None: none given, as after a new head without
        ``labels=``); undoing ``tx`` restores what was there."""
        old = self._given.get(model)
        tx.add(lambda: self._set(model, old))
        self._set(model, None if names is None else tuple(names))

    def keep(self, model: nn.Module, names: Sequence[str]) -> None:
        """Names found in a data set's class folders (``load_data``): what a head sized by
        that data is called. Not a command, so nothing to undo."""
        self._set(model, tuple(names))

    def _set(self, model: nn.Module, names: tuple[str, ...] | None) -> None:
        if names is None:
            self._given.pop(model, None)
        else:
            self._given[model] = names


def config_names(model: nn.Module) -> tuple[str, ...] | None:
    """A Hugging Face config's ``id2label``, unless it is transformers' ``LABEL_i`` filler."""
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if not isinstance(id2label, dict) or not id2label:
        return None
    names = tuple(str(id2label[i]) for i in sorted(id2label))
    filler = all(n == f"{_DEFAULT_HF_LABEL}{i}" for i, n in enumerate(names))
    return None if filler else names


def dataset_names(data: object) -> tuple[str, ...] | None:
    """The ``classes`` of a loader's dataset (under any ``Subset``), as ImageFolder has."""
    classes = getattr(base_dataset(getattr(data, "dataset", None)), "classes", None)
    if isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes):
        return tuple(classes)
    return None


def pick(count: int, *sources: Sequence[str] | None) -> tuple[str, ...]:
    """The first source that names ``count`` classes, else the class indices as names."""
    for names in sources:
        if names is not None and len(names) == count:
            return tuple(names)
    return tuple(str(i) for i in range(count))
