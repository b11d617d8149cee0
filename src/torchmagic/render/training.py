"""Renderables for training results: fit histories (one run, or several side by side,
with a chart in HTML) and the AMP status. Live progress is in ``progress``."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..core.training.amp import AmpStatus
from ..core.training.fit import EpochMetrics, FitHistory, StepInfo
from ..core.training.progressive import Unfrozen
from . import chart, theme
from .base import Rendered, human, lr, table


def _num(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def group_names(snapshot: StepInfo | EpochMetrics) -> tuple[str, ...]:
    """Labels for ``snapshot.lrs``: the loop's group names when it sends them (a
    ``groups`` field parallel to ``lrs``), else "group i" by position."""
    names = getattr(snapshot, "groups", None)
    if names and len(names) == len(snapshot.lrs):
        return tuple(names)
    return tuple(f"group {i}" for i in range(len(snapshot.lrs)))


def lr_text(lrs: Sequence[float], names: Sequence[str]) -> str:
    """One lr when every group shares it, else each group's by name."""
    if len(set(lrs)) <= 1:
        return lr(lrs[0]) if lrs else ""
    return ", ".join(f"{name}: {lr(value)}" for name, value in zip(names, lrs, strict=True))


def epoch_table(epochs: Sequence[EpochMetrics], title: str = "") -> Table:
    """One row per epoch; validation columns only when a run validated, and one lr
    column per group (named) when the groups' lrs differ."""
    validated = any(m.val_loss is not None or m.val_accuracy is not None for m in epochs)
    per_group = any(len(set(m.lrs)) > 1 for m in epochs)
    names = group_names(max(epochs, key=lambda m: len(m.lrs))) if epochs else ()
    lr_columns = [f"lr {name}" for name in names] if per_group else ["lr"]
    columns = [
        "epoch",
        "train loss",
        *(["val loss", "val acc"] if validated else []),
        "samples/s",
        "time (s)",
        *lr_columns,
    ]
    drawn = table(title or None, [(c, "right") for c in columns], whole=("epoch",))
    for m in epochs:
        rate = m.samples / m.seconds if m.seconds else 0.0
        lrs = [lr(value) for value in m.lrs] if per_group else [lr_text(m.lrs, ())]
        drawn.add_row(
            str(m.epoch),
            _num(m.train_loss),
            *([_num(m.val_loss), _pct(m.val_accuracy)] if validated else []),
            human(rate),
            f"{m.seconds:.1f}",
            *lrs,
        )
    return drawn


def unfrozen_text(event: Unfrozen) -> str:
    """One progressive-unfreezing event, for the live view and the history."""
    return f"unfroze {event.block} after epoch {event.epoch} at base lr {lr(event.base_lr)}"


class HistoryView(Rendered):
    """A rendered view that also carries the histories it shows (``.histories``) and adds
    the chart to its HTML."""

    def __init__(
        self, renderable: RenderableType, histories: Sequence[FitHistory], width: int | None = None
    ) -> None:
        super().__init__(renderable, width)
        self.histories = tuple(histories)

    def __getattr__(self, name: str) -> Any:
        """A view of one run reads like its history (``history = %fit …`` then
        ``history.epochs``, ``.steps``, ``.stop_reason``)."""
        histories = self.__dict__.get("histories", ())
        if not name.startswith("_") and len(histories) == 1:
            return getattr(histories[0], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        bundle = super()._repr_mimebundle_(include, exclude)
        if "text/html" in bundle:
            bundle["text/html"] += chart.history_chart(self.histories)
        return bundle


@dataclass(frozen=True)
class FitRuns:
    """Every %fit run of a session, oldest first: what ``render`` compares side by side."""

    runs: tuple[FitHistory, ...]


def _ending(h: FitHistory) -> Text:
    if h.stopped:
        return Text(f"stopped: {h.stopped}", style=theme.style("warning"))
    return Text("completed", style=theme.style("ok"))


def fit_history(history: FitHistory, width: int | None = None) -> HistoryView:
    title = (
        f"{history.label} · {history.model_name} · {history.precision}"
        + (" · cached features" if history.cached_features else "")
        + f" · {history.steps} steps · {human(history.samples_per_s)} samples/s"
        + f" · {history.seconds:.1f} s"
    )
    if history.data_wait_share is not None:
        title += f" · data wait {100 * history.data_wait_share:.0f} %"
    parts: list[RenderableType] = [epoch_table(history.epochs, title)]
    parts.extend(Text(unfrozen_text(e), style=theme.style("info")) for e in history.unfreezes)
    if history.best_epoch is not None:
        parts.append(Text(f"weights of the best epoch ({history.best_epoch}) kept"))
    parts.append(_ending(history))
    return HistoryView(Group(*parts), [history], width)


def fits(histories: Sequence[FitHistory], width: int | None = None) -> HistoryView:
    """Every %fit of the session side by side: one column per run."""
    if not histories:
        return HistoryView(Text("no %fit runs yet", style=theme.style("dim")), [], width)
    drawn = table("%fit runs", [("", "left"), *((h.label, "right") for h in histories)], whole=(0,))
    last = [h.epochs[-1] if h.epochs else None for h in histories]
    rows = [
        ("model", [h.model_name for h in histories]),
        ("epochs", [str(len(h.epochs)) for h in histories]),
        ("steps", [str(h.steps) for h in histories]),
        ("train loss", [_num(m.train_loss) if m else "" for m in last]),
        ("val loss", [_num(m.val_loss) if m else "" for m in last]),
        ("val acc", [_pct(m.val_accuracy) if m else "" for m in last]),
        ("samples/s", [human(h.samples_per_s) for h in histories]),
        ("time (s)", [f"{h.seconds:.1f}" for h in histories]),
        ("precision", [h.precision for h in histories]),
        ("features", ["cached" if h.cached_features else "computed" for h in histories]),
        ("ended", ["stopped" if h.stopped else "completed" for h in histories]),
    ]
    for label, values in rows:
        drawn.add_row(label, *values)
    return HistoryView(drawn, histories, width)


def amp_status(status: AmpStatus, width: int | None = None) -> Rendered:
    if not status.enabled:  # the decision, with its reason when it was not the one asked for
        head = Text(f"AMP off: {status.reason}" if status.reason else "AMP off", style="bold")
    else:
        head = Text(
            f"AMP on: autocast {status.dtype} on {status.device_type}",
            style=theme.style("ok", bold=True),
        )
    parts: list[RenderableType] = [head]
    if status.scaler:
        scale = "" if status.scale is None else f", scale {status.scale:g}"
        parts.append(Text(f"GradScaler bound to the session{scale}"))
    elif status.enabled:
        parts.append(Text("no GradScaler (not needed for bf16)"))
    if status.note:
        parts.append(Text(status.note, style=theme.style("dim")))
    return Rendered(Group(*parts), width)
