"""Classification metrics by name, each one torchmetrics' own: the names ``fit(metric=...)``
measures on the validation data after every epoch, and the top-k accuracy an evaluation
reports. Each name maps to a torchmetrics class with its arguments (``f1``, ``precision``
and ``recall`` macro-averaged, torchmetrics' default; ``accuracy`` and ``top5`` over all
samples, as ``val_accuracy`` counts); whether a larger value is better is the class's own
``higher_is_better``. torchmetrics is imported when a metric is built, never before."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import TorchMagicError

# name -> (torchmetrics.classification class name, its keyword arguments)
METRICS: dict[str, tuple[str, dict[str, Any]]] = {
    "accuracy": ("MulticlassAccuracy", {"average": "micro"}),
    "f1": ("MulticlassF1Score", {}),
    "precision": ("MulticlassPrecision", {}),
    "recall": ("MulticlassRecall", {}),
    "top5": ("MulticlassAccuracy", {"average": "micro", "top_k": 5}),
    "auroc": ("MulticlassAUROC", {}),
}


def _class(name: str) -> Any:
    from torchmetrics import classification  # lazily: heavy import

    return getattr(classification, METRICS[name][0])


def build(name: str, classes: int) -> Any:
    """A fresh torchmetrics metric ``name`` over ``classes`` classes (refused by
    torchmetrics when it cannot be, e.g. ``top5`` over fewer than 5 classes)."""
    return _class(name)(num_classes=classes, **METRICS[name][1])


def top_k_accuracy(classes: int, k: int) -> Any:
    """The share of samples whose class is among the ``k`` best scores."""
    return _class("accuracy")(num_classes=classes, average="micro", top_k=k)


def top_k(name: str) -> int:
    """How many of the best scores the metric reads (1 but for top-k accuracy)."""
    return int(METRICS[name][1].get("top_k", 1))


def higher_is_better(name: str) -> bool:
    return bool(_class(name).higher_is_better)


def metric_names(given: Sequence[str] | str) -> tuple[str, ...]:
    """The metrics ``given`` by name (a sequence, or one comma-separated string), each
    once in the order given; an unknown name is refused in one line naming the known."""
    words = given.split(",") if isinstance(given, str) else list(given)
    names: list[str] = []
    for word in words:
        name = word.strip().lower() if isinstance(word, str) else word
        if name == "":
            continue
        if name not in METRICS:
            raise TorchMagicError(
                f"unknown metric {word!r}; the metrics are {', '.join(METRICS)}"
                + did_you_mean(name, list(METRICS)),
                param="metric",
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def did_you_mean(word: object, known: Sequence[str]) -> str:
    """'; did you mean f1?' for a near miss, else nothing."""
    close = difflib.get_close_matches(str(word), list(known), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def factories(names: Sequence[str]) -> tuple[tuple[str, Callable[[int], Any]], ...]:
    """(name, build over a count of classes) for each name: what a fit plan is given."""
    return tuple((name, lambda classes, name=name: build(name, classes)) for name in names)
