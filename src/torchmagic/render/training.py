"""Renderables for training results: fit histories (one run, or several side by side,
with a chart in HTML) and the AMP status. Live progress is in ``progress``."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..core.training.amp import AmpStatus
from ..core.training.fit_events import EpochMetrics, FitHistory, StepInfo
from ..core.training.progressive import Unfrozen
from . import chart, theme
from .base import Rendered, human, human_bytes, lr, share, table

SIGNIFICANT = 4  # digits of a loss; a column's smallest value keeps that many
MAX_DECIMALS = 6


def decimals(values: Iterable[float | None], significant: int = SIGNIFICANT) -> int:
    """The decimals that give a column's smallest non-zero value ``significant`` digits
    (at most ``MAX_DECIMALS``): every number of the column is written with them, so
    2.314 is followed by 2.200, not 2.2."""
    sizes = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    if not sizes:
        return significant - 1
    return max(0, min(MAX_DECIMALS, significant - 1 - math.floor(math.log10(min(sizes)))))


def numbers(values: Sequence[float | None], significant: int = SIGNIFICANT) -> list[str]:
    """A column of numbers with the same decimals (blank where a value is missing)."""
    places = decimals(values, significant)
    return ["" if v is None else f"{v:.{places}f}" for v in values]


def growing_numbers(values: Sequence[float | None]) -> list[str]:
    """A column that grows while a run goes on (losses per epoch): its first value decides
    the decimals (one digit more than ``numbers`` gives it, room for a tenfold fall), so
    a row added never rewrites the rows above (1.417 does not become 1.4168)."""
    first = next((v for v in values if v is not None and math.isfinite(v) and v != 0), None)
    places = decimals([first], SIGNIFICANT + 1)
    return ["" if v is None else f"{v:.{places}f}" for v in values]


def lr_fixed(value: float) -> str:
    """An lr in a column: always ``d.dde-N`` (1.00e-3, 9.29e-6), so a column of lrs keeps
    its width and its digits while a schedule moves it; 0 (a schedule's end) is "0"."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _pct(value: float | None) -> str:
    return "" if value is None else share(100 * value)


METRIC_DECIMALS = 4  # a named metric (f1, auroc…): a value between 0 and 1


def metric_names(epochs: Iterable[EpochMetrics]) -> list[str]:
    """The named metrics measured in ``epochs``, in the order the run measured them."""
    names: dict[str, None] = {}
    for m in epochs:
        names.update(dict.fromkeys(m.val_metrics))
    return list(names)


def _metric(value: float | None) -> str:
    return "" if value is None else f"{value:.{METRIC_DECIMALS}f}"


def group_names(snapshot: StepInfo | EpochMetrics) -> tuple[str, ...]:
    """Labels for ``snapshot.lrs``: the loop's group names when it sends them (a
    ``groups`` field parallel to ``lrs``), else "group i" by position."""
    names = getattr(snapshot, "groups", None)
    if names and len(names) == len(snapshot.lrs):
        return tuple(names)
    return tuple(f"group {i}" for i in range(len(snapshot.lrs)))


LISTED_GROUPS = 2  # more groups than this: the head's lr and the others' range


def head_position(snapshot: StepInfo | EpochMetrics) -> int:
    """Where the head's group is in ``snapshot.lrs`` (the first, when the loop did not say)."""
    head = getattr(snapshot, "head", None)
    return head if head is not None and 0 <= head < len(snapshot.lrs) else 0


def lr_text(lrs: Sequence[float], names: Sequence[str], head: int = 0) -> str:
    """One lr when every group shares it; each group's by name when there are two; with
    more, the head's and the range of the others, so the line never wraps (``lr_fixed``:
    it keeps its width while a schedule moves the lr)."""
    if len(set(lrs)) <= 1:
        return lr_fixed(lrs[0]) if lrs else ""
    if len(lrs) <= LISTED_GROUPS:
        pairs = zip(names, lrs, strict=True)
        return ", ".join(f"{name}: {lr_fixed(value)}" for name, value in pairs)
    others = [v for i, v in enumerate(lrs) if i != head]
    return (
        f"{names[head]}: {lr_fixed(lrs[head])}, {len(others)} others "
        f"{lr_fixed(min(others))}–{lr_fixed(max(others))}"
    )


def epoch_table(epochs: Sequence[EpochMetrics], title: str = "") -> Table:
    """One row per epoch; validation columns only when a run validated; the head group's
    lr, then time and samples/s, then (when the groups' lrs differ) one lr column per
    other group (named). A narrow width hides the other groups' lrs first, then
    samples/s, then time, as it hides the least important columns of every table. Each
    column's numbers share their decimals, lrs their format."""
    validated = any(m.val_loss is not None or m.val_accuracy is not None for m in epochs)
    measured = metric_names(epochs)
    per_group = any(len(set(m.lrs)) > 1 for m in epochs)
    widest = max(epochs, key=lambda m: len(m.lrs)) if epochs else None
    names = group_names(widest) if widest is not None else ()
    head = head_position(widest) if widest is not None else 0
    others = [i for i in range(len(names)) if i != head] if per_group else []
    other_columns = [f"lr {names[i]}" for i in others]
    columns = [
        "epoch",
        "train loss",
        *(["val loss", "val acc"] if validated else []),
        *(f"val {name}" for name in measured),
        f"lr {names[head]}" if per_group else "lr",
        "time (s)",
        "samples/s",
        *other_columns,
    ]
    hide = [*reversed(other_columns), "samples/s", "time (s)"]
    drawn = table(title or None, [(c, "right") for c in columns], whole=("epoch",), hide=hide)
    train_losses = growing_numbers([m.train_loss for m in epochs])
    val_losses = growing_numbers([m.val_loss for m in epochs])
    for m, train_loss, val_loss in zip(epochs, train_losses, val_losses, strict=True):
        rate = m.samples / m.seconds if m.seconds else 0.0
        drawn.add_row(
            str(m.epoch),
            train_loss,
            *([val_loss, _pct(m.val_accuracy)] if validated else []),
            *(_metric(m.val_metrics.get(name)) for name in measured),
            _lr_cell(m.lrs, head_position(m) if per_group else 0),
            f"{m.seconds:.1f}",
            human(rate),
            *(_lr_cell(m.lrs, i) for i in others),
        )
    return drawn


def _lr_cell(lrs: Sequence[float], at: int) -> str:
    return lr_fixed(lrs[at]) if at < len(lrs) else ""


def unfrozen_text(event: Unfrozen) -> str:
    """One progressive-unfreezing event, for the live view and the history."""
    return f"unfroze {event.block} after epoch {event.epoch} at base lr {lr(event.base_lr)}"


class HistoryView(Rendered):
    """A rendered view that also carries the histories it shows (``.histories``) and adds
    the chart to its HTML; ``sequential`` runs (fine_tune's phases) are charted one after
    the other, not over each other."""

    def __init__(
        self,
        renderable: RenderableType,
        histories: Sequence[FitHistory],
        width: int | None = None,
        sequential: bool = False,
    ) -> None:
        super().__init__(renderable, width)
        self.histories = tuple(histories)
        self.sequential = sequential

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
            bundle["text/html"] += chart.history_chart(self.histories, self.sequential)
        return bundle


@dataclass(frozen=True)
class FitRuns:
    """Every %fit run of a session, oldest first: what ``render`` compares side by side."""

    runs: tuple[FitHistory, ...]


def _ending(h: FitHistory) -> Text:
    if h.stopped:
        return Text(f"stopped: {h.stopped}", style=theme.style("warning"))
    return Text("completed", style=theme.style("ok"))


def step_text(accumulate: int, clip: float | None) -> str:
    """' · 4 batches per step · clip 1' — only what differs from a plain step."""
    return (f" · {accumulate} batches per step" if accumulate > 1 else "") + (
        f" · clip {clip:g}" if clip is not None else ""
    )


def schedules_text(history: FitHistory) -> str:
    """How each scheduler stepped in the run."""
    if not history.schedules:
        return "schedulers: none"
    return "schedulers: " + ", ".join(
        f"{c.name} per {c.every} ({c.reason})" for c in history.schedules
    )


def fit_history(history: FitHistory, width: int | None = None) -> HistoryView:
    """One run, each fact once: what trained and how fast (the title), the epochs, how
    the schedulers stepped, the blocks unfrozen on the way, and how it ended."""
    return HistoryView(Group(*_history_parts(history)), [history], width)


def _history_parts(history: FitHistory) -> list[RenderableType]:
    title = (
        f"{history.label} · {history.model_name} · {history.precision}"
        + (" · cached features" if history.cached_features else "")
        + step_text(history.accumulate, history.clip)
        + f" · {history.steps} steps · {human(history.samples_per_s)} samples/s"
        + f" · {history.seconds:.1f} s"
    )
    if history.data_wait_share is not None:
        title += f" · data wait {100 * history.data_wait_share:.0f} %"
    parts: list[RenderableType] = [epoch_table(history.epochs, title)]
    parts.append(Text(schedules_text(history), style=theme.style("dim")))
    parts.extend(Text(unfrozen_text(e), style=theme.style("info")) for e in history.unfreezes)
    if history.best_epoch is not None:
        by = "" if history.monitor is None else f" by {_monitor_text(history.monitor)}"
        parts.append(Text(f"weights of the best epoch{by} ({history.best_epoch}) kept"))
    if history.exported is not None:
        parts.append(Text(_exported_text(history), style=theme.style("ok")))
    if history.not_exported is not None:
        parts.append(Text(history.not_exported, style=theme.style("warning")))
    parts.append(_ending(history))
    return parts


def _monitor_text(monitor: str) -> str:
    return {"loss": "val loss", "acc": "val accuracy"}.get(monitor, f"val {monitor}")


def _exported_text(history: FitHistory) -> str:
    """Which weights went where, and how well the file matched the live model."""
    report = history.exported
    assert report is not None
    epoch = history.best_epoch or (history.epochs[-1].epoch if history.epochs else None)
    which = "the best epoch's" if history.best_epoch is not None else "the last epoch's"
    matched = (
        "not read back (no onnxruntime)"
        if report.max_difference is None
        else f"read back within {report.max_difference:.1e} of the live model"
    )
    return (
        f"exported {which} weights (epoch {epoch}) to {report.path} "
        f"({human_bytes(report.nbytes)}); {matched}"
    )


def fine_tune_runs(
    steps: Sequence[tuple[RenderableType, FitHistory | None]], width: int | None = None
) -> HistoryView:
    """The recipe in the order it ran: each command's report, then the run after it; the
    chart draws each run after the one before."""
    parts: list[RenderableType] = []
    for report, run in steps:
        parts.append(report)
        if run is not None:
            parts.extend(_history_parts(run))
    runs = [run for _, run in steps if run is not None]
    return HistoryView(Group(*parts), runs, width, sequential=True)


def fits(histories: Sequence[FitHistory], width: int | None = None) -> HistoryView:
    """Every %fit of the session side by side: one column per run."""
    if not histories:
        return HistoryView(Text("no %fit runs yet", style=theme.style("dim")), [], width)
    drawn = table(
        "%fit runs",
        [("", "left"), *((h.label, "right") for h in histories)],
        whole=(0,),
        hide=range(1, len(histories)),  # the oldest runs first
    )
    last = [h.epochs[-1] if h.epochs else None for h in histories]
    rows = [
        ("model", [h.model_name for h in histories]),
        ("epochs", [str(len(h.epochs)) for h in histories]),
        ("steps", [str(h.steps) for h in histories]),
        ("train loss", numbers([m.train_loss if m else None for m in last])),
        ("val loss", numbers([m.val_loss if m else None for m in last])),
        ("val acc", [_pct(m.val_accuracy) if m else "" for m in last]),
        *(
            (f"val {name}", [_metric(m.val_metrics.get(name)) if m else "" for m in last])
            for name in metric_names(m for m in last if m is not None)
        ),
        *(
            (
                f"best val {name}",
                [_best(h, name) for h in histories],
            )
            for name in metric_names(m for h in histories for m in h.epochs)
        ),
        ("samples/s", [human(h.samples_per_s) for h in histories]),
        ("time (s)", [f"{h.seconds:.1f}" for h in histories]),
        ("precision", [h.precision for h in histories]),
        ("features", ["cached" if h.cached_features else "computed" for h in histories]),
        ("ended", ["stopped" if h.stopped else "completed" for h in histories]),
    ]
    if any(h.accumulate > 1 or h.clip is not None for h in histories):
        rows.insert(3, ("batches/step", [str(h.accumulate) for h in histories]))
        rows.insert(4, ("clip", ["" if h.clip is None else f"{h.clip:g}" for h in histories]))
    for label, values in rows:
        drawn.add_row(label, *values)
    return HistoryView(drawn, histories, width)


def _best(history: FitHistory, name: str) -> str:
    """The run's best value of a named metric and its epoch (larger is better for every
    metric a run can name)."""
    values = [(m.val_metrics[name], m.epoch) for m in history.epochs if name in m.val_metrics]
    if not values:
        return ""
    value, epoch = max(values, key=lambda pair: (pair[0], -pair[1]))
    return f"{_metric(value)} (epoch {epoch})"


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
