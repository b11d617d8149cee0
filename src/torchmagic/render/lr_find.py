"""The lr range test's result: a short text with the suggestion and the rule behind it,
and (in HTML, when matplotlib is installed) the loss-vs-lr chart.

The chart is drawn with matplotlib's object-oriented API (a ``Figure`` saved to a
buffer), never pyplot, so the user's backend is left alone. It is inline SVG with a
transparent background; axes and labels are written in ``currentColor`` (the notebook's
text colour) and the lines use mid-tone colours that read on light and dark themes.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.text import Text

from ..core.training.lr_find import LrFindResult
from . import theme
from .base import Rendered, lr
from .chart import INK, LABEL_SIZE, TICK_SIZE, figure_svg
from .theme import ROLES
from .training import numbers

_RAW, _SMOOTH, _MARK = (ROLES[role].fallback for role in ("dim", "accent", "warning"))


def chart_svg(result: LrFindResult) -> str:
    """Loss vs lr (log x): raw losses faint, the smoothed curve, the falling range shaded
    and the suggestion marked. '' without matplotlib or without points."""
    if len(result.lrs) < 2:
        return ""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return ""
    fig = Figure(figsize=(5, 2.8))
    fig.patch.set_alpha(0)
    ax = fig.subplots()
    ax.set_facecolor("none")
    # the raw loss dotted at full strength (faint on dark at alpha .6), the smoothed solid
    ax.plot(result.lrs, result.losses, color=_RAW, linewidth=1.0, linestyle=":", label="loss")
    ax.plot(result.lrs, result.smoothed, color=_SMOOTH, linewidth=1.6, label="smoothed")
    if result.falling is not None:
        ax.axvspan(*result.falling, color=_SMOOTH, alpha=0.12, label="loss falls")
    suggestion = result.suggestion
    if suggestion is not None:
        at = min(range(len(result.lrs)), key=lambda i: abs(result.lrs[i] - suggestion))
        ax.plot(
            [suggestion],
            [result.smoothed[at]],
            "o",
            color=_MARK,
            label=f"suggestion {lr(suggestion)}",
        )
    ax.set_xscale("log")
    # lrs as the text writes them (1e-5, 0.001), full size: no raised exponent in small type
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: lr(value)))
    ax.set_ylim(
        *loss_span(result, raw=True, headroom=HEADROOM)
    )  # the divergence at the end goes off the top
    ax.set_xlabel(lr_axis(result), fontsize=LABEL_SIZE, color=INK)
    ax.set_ylabel("loss", fontsize=LABEL_SIZE, color=INK)
    ax.tick_params(labelsize=TICK_SIZE, colors=INK, which="both")
    for spine in ax.spines.values():
        spine.set_color(INK)
    ax.legend(fontsize=TICK_SIZE, frameon=False, labelcolor=INK)
    return figure_svg(fig, "lr_find chart")


HEADROOM = 0.1  # of the drawn range, above and below the curve


def loss_span(
    result: LrFindResult, raw: bool = False, headroom: float = 0.0
) -> tuple[float, float]:
    """The losses the chart shows: the smoothed curve from its start down to its minimum
    and back up to the level it started from (with ``raw``, the raw losses of that
    stretch too), ``headroom`` of the range added each side. Past that the loss diverges
    and goes off the top: neither its values nor its non-finite losses stretch the axis.
    A loss that never fell has no such stretch: its whole finite curve is shown (the run
    stopped it at a few times its minimum), not the first step or two of its rise."""
    smoothed = result.smoothed
    finite = [i for i, v in enumerate(smoothed) if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lowest = min(finite, key=lambda i: smoothed[i])
    level = max(smoothed[i] for i in finite if i <= lowest or result.falling is None)
    end = next((i for i in finite if i > lowest and smoothed[i] > level), len(smoothed))
    shown = [smoothed[i] for i in finite if i < end]
    if raw:
        shown += [v for v in result.losses[:end] if math.isfinite(v) and v <= level]
    low, high = min(shown), level
    if high <= low:  # a flat curve: a unit range around it
        return low - 0.5, high + 0.5
    pad = headroom * (high - low)
    return low - pad, high + pad


def lr_axis(result: LrFindResult) -> str:
    """The x axis: the lr of the reference group, named as the header names it."""
    return f"lr (group {result.reference_name})"


# braille dots of one character cell: _DOTS[column][row], rows top down
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
CURVE_ROWS = 6
CURVE_MAX_WIDTH = 64


class TextCurve:
    """The smoothed loss against lr (log x) in braille dots, for a terminal: the range
    where the loss falls drawn heavy on the axis and the suggestion marked ▲ below it.
    As wide as the console allows, up to ``CURVE_MAX_WIDTH`` columns of plot."""

    def __init__(self, result: LrFindResult) -> None:
        self.result = result

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        result = self.result
        low, high = loss_span(result)
        top, bottom = numbers([high, low], significant=3)
        margin = max(len(top), len(bottom)) + 1
        columns = max(10, min(CURVE_MAX_WIDTH, options.max_width - margin - 1))
        dots = 4 * CURVE_ROWS
        cells = [[0] * columns for _ in range(CURVE_ROWS)]
        previous: int | None = None
        for x, value in enumerate(_resampled(result.lrs, result.smoothed, 2 * columns)):
            if not low <= value <= high:  # off the top (or not finite)
                previous = None
                continue
            y = round((high - value) / (high - low) * (dots - 1))
            low_row, high_row = sorted((y, y if previous is None else previous))
            for row in range(low_row, high_row + 1):  # joined to the column before
                cells[row // 4][x // 2] |= _DOTS[x % 2][row % 4]
            previous = y
        curve = theme.style("accent")
        for index, row_cells in enumerate(cells):
            label = top if index == 0 else bottom if index == CURVE_ROWS - 1 else ""
            line = Text(f"{label:>{margin - 1}} ┤" if label else " " * margin + "│")
            line.append("".join(chr(0x2800 + c) for c in row_cells).rstrip("\u2800"), curve)
            yield line
        yield self._axis(margin, columns)
        labels = self._labels(margin, columns)
        name = f"   {lr_axis(result)}"
        if labels.cell_len + len(name) <= options.max_width:
            labels.append(name)
            yield labels
        else:
            yield labels
            yield Text(" " * margin + name.strip(), theme.style("dim"))

    def _column(self, value: float, columns: int) -> int:
        return _log_positions([self.result.lrs[0], value, self.result.lrs[-1]], columns)[1]

    def _axis(self, margin: int, columns: int) -> Text:
        result = self.result
        axis = ["─"] * columns
        if result.falling is not None:
            first, last = (self._column(v, columns) for v in result.falling)
            axis[first : last + 1] = "━" * (last + 1 - first)
        line = Text(" " * margin + "└")
        mark = None if result.suggestion is None else self._column(result.suggestion, columns)
        for index, char in enumerate(axis):
            if index == mark:
                line.append("▲", theme.style("warning", bold=True))
            else:
                line.append(char, theme.style("ok") if char == "━" else None)
        return line

    def _labels(self, margin: int, columns: int) -> Text:
        """The first and last lr under the axis ends, the suggestion under its ▲ (first:
        the others give way when they would touch it)."""
        result = self.result
        width = columns + 1  # the corner, then the axis
        row = [" "] * width

        def put(start: int, word: str) -> None:
            start = min(max(0, start), width - len(word))
            if all(c == " " for c in row[max(0, start - 1) : start + len(word) + 1]):
                row[start : start + len(word)] = word

        if result.suggestion is not None:
            word = lr(result.suggestion)
            put(self._column(result.suggestion, columns) + 1 - len(word) // 2, word)
        put(0, lr(result.lrs[0]))
        last = lr(result.lrs[-1])
        put(width - len(last), last)
        return Text(" " * margin + "".join(row).rstrip(), theme.style("dim"))


def _resampled(lrs: Sequence[float], values: Sequence[float], width: int) -> list[float]:
    """``values`` at ``width`` lrs evenly spaced on a log scale from the first lr to the
    last, interpolated linearly in log lr between the measured points."""
    xs = [math.log10(v) for v in lrs]
    out, i = [], 0
    for column in range(width):
        x = xs[0] + (xs[-1] - xs[0]) * column / max(1, width - 1)
        while i < len(xs) - 2 and xs[i + 1] < x:
            i += 1
        span = xs[i + 1] - xs[i]
        share = min(max((x - xs[i]) / span, 0.0), 1.0) if span else 0.0
        out.append(values[i] + (values[i + 1] - values[i]) * share)
    return out


def _log_positions(lrs: Sequence[float], width: int) -> list[int]:
    """Each lr's position in ``range(width)`` on a log scale from the first to the last."""
    first, last = math.log10(lrs[0]), math.log10(lrs[-1])
    span = (last - first) or 1.0
    return [
        min(width - 1, max(0, round((math.log10(v) - first) / span * (width - 1)))) for v in lrs
    ]


def _lines(result: LrFindResult) -> list[RenderableType]:
    ran = len(result.lrs)
    head = Text(
        f"lr_find · {result.model_name} · {ran} steps from {lr(result.start)} to "
        f"{lr(result.end)} (lr of group {result.reference_name})",
        style="bold",
    )
    parts: list[RenderableType] = [head]
    if result.stopped:
        parts.append(Text(f"stopped early: {result.stopped}", style="dim"))
    if result.suggestion is None:
        parts.append(
            Text(
                "no suggestion: the smoothed loss never fell (the lrs are unchanged)",
                style="yellow",
            )
        )
    else:
        line = Text("suggestion ")
        line.append(lr(result.suggestion), style="bold green")
        line.append(f" ({result.rule})")
        if result.falling is not None:
            low, high = result.falling
            line.append(f" · the loss falls between lrs {lr(low)} and {lr(high)}")
        parts.append(line)
    others = [r for i, r in enumerate(result.ratios) if i != result.reference_group]
    if others:
        shown = ", ".join(f"{r:.3g}×" for r in others)
        parts.append(Text(f"other groups scaled with it, ratios kept: {shown}", style="dim"))
    if result.applied is not None:
        parts.append(
            Text(
                f"applied: base lr of group {result.reference_name} = "
                f"{lr(result.suggestion or 0)}, other groups in proportion "
                "(one history entry: undo reverts it)",
                style="green",
            )
        )
    bound = f" ({', '.join(result.schedulers)}: not stepped)" if result.schedulers else ""
    parts.append(
        Text(f"weights, optimizer, schedulers{bound} and random state restored", style="dim")
    )
    return parts


class LrFindView(Rendered):
    """The text with the curve drawn in text; in HTML the chart in its place (the text
    curve where matplotlib is missing)."""

    def __init__(self, result: LrFindResult, width: int | None = None) -> None:
        curve = [TextCurve(result)] if len(result.lrs) >= 2 else []
        super().__init__(Group(*_lines(result), *curve), width)
        self.result = result

    def __getattr__(self, name: str) -> Any:
        """Reads like the result it shows (``r = %lr_find …`` then ``r.suggestion``)."""
        result = self.__dict__.get("result")
        if not name.startswith("_") and result is not None:
            return getattr(result, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        bundle = super()._repr_mimebundle_(include, exclude)
        if "text/html" in bundle and (chart := chart_svg(self.result)):
            text = Rendered(Group(*_lines(self.result)), self.width)
            bundle["text/html"] = text._repr_mimebundle_(["text/html"])["text/html"] + chart
        return bundle


def lr_find(result: LrFindResult, width: int | None = None) -> LrFindView:
    return LrFindView(result, width)
