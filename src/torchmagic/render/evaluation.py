"""Drawing an evaluation and a prediction: the numbers line, the comparison with an earlier
evaluation, the per-class table, the confusion matrix (HTML: an inline SVG heat map;
text: a compact table), the most confused pairs and the worst samples (HTML: the inputs as
pictures, un-normalized, with true and predicted labels under each, or a text input's
decoded tokens; text: a table of index, path, loss, true and predicted)."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from rich.console import (
    Console,
    ConsoleOptions,
    Group,
    JustifyMethod,
    RenderableType,
    RenderResult,
)
from rich.text import Text

from ..core.evaluation import Comparison, Evaluation, Prediction, Predictions, WorstSample
from . import theme
from .base import FONT, OwnHtml, Rendered, table

MAX_CLASS_ROWS = 30  # more classes: the rows with the lowest f1
MAX_MATRIX = 20  # classes the confusion matrix is drawn for
MOST_CONFUSED_SHOWN = 5
CELL = 22  # px of one heat-map cell
PICTURE = 96  # px of one worst-sample picture's side


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def comparison_text(comparison: Comparison) -> str:
    """``+2.1 points, 14 fixed / 5 broken, p = 0.06: not yet a clear gain``."""
    points = 100 * comparison.accuracy_change
    if comparison.clear:
        verdict = "a clear gain" if points > 0 else "a clear loss"
    elif comparison.fixed + comparison.broken == 0:
        verdict = "no sample changed"
    else:
        verdict = "not yet a clear gain" if points > 0 else "no clear change"
    p = comparison.p_value
    p_text = f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"
    return (
        f"{points:+.1f} points, {comparison.fixed} fixed / {comparison.broken} broken, "
        f"{p_text}: {verdict}"
    )


def _summary(result: Evaluation) -> Text:
    line = Text()
    line.append(f"evaluated `{result.model_name}` on `{result.data_name}`", style="bold")
    facts = [
        f"{result.samples} samples",
        f"accuracy {_pct(result.accuracy)}",
        f"loss {result.loss:.4g}",
    ]
    if result.top_k_accuracy is not None:
        facts.append(f"top-{result.top_k} {_pct(result.top_k_accuracy)}")
    line.append(": " + " · ".join(facts))
    return line


def _class_table(result: Evaluation) -> RenderableType:
    rows = list(result.per_class)
    title = "per class"
    if len(rows) > MAX_CLASS_ROWS:
        rows = sorted(rows, key=lambda r: r.f1)[:MAX_CLASS_ROWS]
        title = f"per class: the {MAX_CLASS_ROWS} lowest f1 of {len(result.per_class)}"
    drawn = table(
        title,
        [
            ("class", "left"),
            ("precision", "right"),
            ("recall", "right"),
            ("f1", "right"),
            ("support", "right"),
        ],
        whole=("class",),
    )
    for row in rows:
        drawn.add_row(
            row.label,
            f"{row.precision:.3f}",
            f"{row.recall:.3f}",
            f"{row.f1:.3f}",
            str(row.support),
        )
    return drawn


class HeatMap(OwnHtml):
    """The confusion matrix: rows the true class, columns the predicted. Text: the counts
    in a compact grid; HTML: an SVG whose cells are shaded by their share of the row."""

    def __init__(self, confusion: torch.Tensor, labels: Sequence[str]) -> None:
        self.counts = confusion.tolist()
        self.labels = list(labels)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(len(str(max(max(r) for r in self.counts))), 2)
        names = [label[:8] for label in self.labels]
        side = max(len(n) for n in names)
        yield Text("confusion (rows true, columns predicted)", style="bold")
        yield Text(" " * (side + 1) + " ".join(str(i).rjust(width) for i in range(len(names))))
        for i, (name, row) in enumerate(zip(names, self.counts, strict=True)):
            line = Text(name.rjust(side) + " ")
            for j, count in enumerate(row):
                style = (
                    theme.style("ok")
                    if i == j and count
                    else (theme.style("error") if count else theme.style("dim"))
                )
                line.append(str(count).rjust(width), style=style)
                line.append(" ")
            yield line
        key = ", ".join(f"{i}={n}" for i, n in enumerate(self.labels) if n != str(i))
        if key:
            yield Text(f"columns: {key}", style=theme.style("dim"))

    def html(self) -> str:
        n = len(self.labels)
        margin = 8 * min(max(len(label) for label in self.labels), 14) + 8
        size = margin + n * CELL
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" '
            f'role="img" aria-label="confusion matrix" style="{FONT};font-size:11px">'
        ]
        for i, row in enumerate(self.counts):
            total = sum(row) or 1
            y = margin + i * CELL
            label = html.escape(self.labels[i][:14])
            parts.append(
                f'<text x="{margin - 4}" y="{y + CELL * 0.7}" text-anchor="end" '
                f'fill="currentColor">{label}</text>'
            )
            for j, count in enumerate(row):
                x = margin + j * CELL
                share = count / total
                colour = "#2e9a3e" if i == j else "#e0403a"
                parts.append(
                    f'<rect x="{x}" y="{y}" width="{CELL - 1}" height="{CELL - 1}" '
                    f'fill="{colour}" fill-opacity="{0.08 + 0.92 * share:.3f}">'
                    f"<title>true {label} · predicted {html.escape(self.labels[j])}: "
                    f"{count}</title></rect>"
                )
                if count:
                    parts.append(
                        f'<text x="{x + CELL / 2}" y="{y + CELL * 0.7}" text-anchor="middle" '
                        f'fill="currentColor">{count}</text>'
                    )
        for j, name in enumerate(self.labels):
            left = margin + j * CELL + CELL * 0.65
            parts.append(
                f'<text x="{left}" y="{margin - 4}" transform="rotate(-60 {left} {margin - 4})" '
                f'fill="currentColor">{html.escape(name[:14])}</text>'
            )
        parts.append("</svg>")
        title = '<div style="font-weight:bold">confusion (rows true, columns predicted)</div>'
        return f'<div class="torchmagic-confusion">{title}{"".join(parts)}</div>'


def _most_confused(result: Evaluation) -> Text:
    pairs = result.most_confused[:MOST_CONFUSED_SHOWN]
    shown = ", ".join(f"{t} → {p} ({n})" for t, p, n in pairs)
    return Text(f"most confused (true → predicted): {shown}")


def picture(sample: WorstSample, normalization: Any) -> str:
    """One image input as an inline PNG (un-normalized); '' when it is not an image."""
    image = sample.input
    if not isinstance(image, torch.Tensor) or image.ndim != 3 or image.shape[0] not in (1, 3):
        return ""
    from PIL import Image

    pixels = image.float()
    if normalization is not None:
        mean, std = (torch.tensor(v).reshape(-1, 1, 1) for v in normalization)
        if len(mean) in (1, pixels.shape[0]):
            pixels = pixels * std + mean
    low, high = float(pixels.min()), float(pixels.max())
    if normalization is None and (low < 0 or high > 1):  # unknown scale: stretch
        pixels = (pixels - low) / ((high - low) or 1)
    array = (pixels.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    drawn = Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)
    buffer = io.BytesIO()
    drawn.save(buffer, format="PNG")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<img src="data:image/png;base64,{data}" width="{PICTURE}" height="{PICTURE}" '
        f'style="image-rendering:pixelated;display:block" alt="sample {sample.index}">'
    )


class WorstSamples(OwnHtml):
    """The samples with the largest loss: a table in text; pictures (or decoded text)
    with their labels in HTML."""

    def __init__(self, result: Evaluation) -> None:
        self.result = result

    def _label(self, index: int) -> str:
        return self.result.labels[index] if 0 <= index < len(self.result.labels) else str(index)

    def _table(self) -> RenderableType:
        has_path = any(s.path for s in self.result.worst)
        path: list[tuple[str, JustifyMethod]] = [("path", "left")] if has_path else []
        columns: list[tuple[str, JustifyMethod]] = [("index", "right"), *path]
        drawn = table(
            f"the {len(self.result.worst)} largest losses",
            [*columns, ("loss", "right"), ("true", "left"), ("predicted", "left")],
            whole=("index", "path"),
        )
        for s in self.result.worst:
            drawn.add_row(
                str(s.index),
                *([s.path or ""] if has_path else []),
                f"{s.loss:.3f}",
                self._label(s.target),
                self._label(s.predicted),
            )
        return drawn

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._table()

    def _items(self) -> Iterator[str]:
        result = self.result
        for s in result.worst:
            shown = picture(s, result.normalization)
            if not shown and isinstance(s.input, dict) and result.decode is not None:
                shown = f'<div style="max-width:16em">{html.escape(result.decode(s.input))}</div>'
            if not shown:
                shown = f"<div>#{s.index}</div>"
            title = html.escape(s.path or f"sample {s.index}")
            caption = (
                f"true {html.escape(self._label(s.target))}<br>"
                f"predicted {html.escape(self._label(s.predicted))}<br>loss {s.loss:.3g}"
            )
            yield (
                f'<figure title="{title}" style="margin:0 8px 8px 0;display:inline-block;'
                f'vertical-align:top">{shown}<figcaption style="{FONT};font-size:11px">'
                f"{caption}</figcaption></figure>"
            )

    def html(self) -> str:
        title = f'<div style="font-weight:bold">the {len(self.result.worst)} largest losses</div>'
        return f'<div class="torchmagic-worst">{title}{"".join(self._items())}</div>'


class ResultView(Rendered):
    """A drawn result that reads like the result it shows (``ev.accuracy``)."""

    def __init__(self, renderable: RenderableType, result: object, width: int | None) -> None:
        super().__init__(renderable, width)
        self.result = result

    def __getattr__(self, name: str) -> Any:
        result = self.__dict__.get("result")
        if not name.startswith("_") and result is not None:
            return getattr(result, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _evaluation_parts(result: Evaluation) -> list[RenderableType]:
    parts: list[RenderableType] = [_summary(result)]
    if result.comparison is not None:
        against = comparison_text(result.comparison)
        parts.append(Text(f"against the earlier evaluation: {against}"))
    parts.append(_class_table(result))
    if len(result.labels) <= MAX_MATRIX:
        parts.append(HeatMap(result.confusion, result.labels))
    else:
        parts.append(
            Text(
                f"confusion matrix: {len(result.labels)} classes, in .confusion",
                style=theme.style("dim"),
            )
        )
    if result.most_confused:
        parts.append(_most_confused(result))
    if result.worst:
        parts.append(WorstSamples(result))
    return parts


def evaluation(result: Evaluation, width: int | None = None) -> ResultView:
    return ResultView(Group(*_evaluation_parts(result)), result, width)


def _prediction_table(items: Sequence[Prediction], title: str) -> RenderableType:
    drawn = table(
        title, [("input", "left"), ("class", "left"), ("probability", "right")], whole=("input",)
    )
    for item in items:
        for rank, (label, p) in enumerate(zip(item.labels, item.probabilities, strict=True)):
            drawn.add_row(item.source if rank == 0 else "", label, _pct(p))
    return drawn


def prediction(result: Prediction, width: int | None = None) -> ResultView:
    title = f"{result.label} ({_pct(result.probabilities[0])})"
    return ResultView(_prediction_table([result], title), result, width)


def predictions(result: Predictions, width: int | None = None) -> ResultView:
    title = f"`{result.model_name}` on {len(result)} inputs"
    return ResultView(_prediction_table(result.items, title), result, width)
