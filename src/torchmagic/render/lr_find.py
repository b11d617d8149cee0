"""The lr range test's result: a short text with the suggestion and the rule behind it,
and (in HTML, when matplotlib is installed) the loss-vs-lr chart.

The chart is drawn with matplotlib's object-oriented API (a ``Figure`` saved to a
buffer), never pyplot, so the user's backend is left alone. It is inline SVG with a
transparent background; axes and labels are written in ``currentColor`` (the notebook's
text colour) and the lines use mid-tone colours that read on light and dark themes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from ..core.training.lr_find import LrFindResult
from .base import Rendered, lr
from .chart import INK, figure_svg
from .theme import ROLES

_RAW, _SMOOTH, _MARK = (ROLES[role].fallback for role in ("dim", "accent", "warning"))


def chart_svg(result: LrFindResult) -> str:
    """Loss vs lr (log x): raw losses faint, the smoothed curve, the falling range shaded
    and the suggestion marked. '' without matplotlib or without points."""
    if len(result.lrs) < 2:
        return ""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return ""
    fig = Figure(figsize=(5, 2.8))
    fig.patch.set_alpha(0)
    ax = fig.subplots()
    ax.set_facecolor("none")
    ax.plot(result.lrs, result.losses, color=_RAW, linewidth=0.8, alpha=0.6, label="loss")
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
    if result.smoothed[0] > 0:  # the divergence at the end goes off the top
        ax.set_ylim(top=result.smoothed[0] * 1.5)
    ax.set_xlabel(f"lr ({result.reference_name})", fontsize=8, color=INK)
    ax.set_ylabel("loss", fontsize=8, color=INK)
    ax.tick_params(labelsize=7, colors=INK, which="both")
    for spine in ax.spines.values():
        spine.set_color(INK)
    ax.legend(fontsize=7, frameon=False, labelcolor=INK)
    return figure_svg(fig, "lr_find chart")


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
        parts.append(Text("no suggestion: the smoothed loss never fell", style="yellow"))
    else:
        line = Text("suggestion ")
        line.append(lr(result.suggestion), style="bold green")
        line.append(f" ({result.rule})")
        if result.falling is not None:
            low, high = result.falling
            line.append(f" · the loss falls from {lr(low)} to {lr(high)}")
        parts.append(line)
    others = [r for i, r in enumerate(result.ratios) if i != result.reference_group]
    if others:
        shown = ", ".join(f"{r:.3g}×" for r in others)
        parts.append(Text(f"other groups scaled with it, ratios kept: {shown}", style="dim"))
    if result.applied is not None:
        parts.append(
            Text(
                f"applied: base lr of {result.reference_name} = {lr(result.suggestion or 0)}, "
                "other groups in proportion (one history entry: undo reverts it)",
                style="green",
            )
        )
    parts.append(Text("weights, optimizer, schedulers and random state restored", style="dim"))
    return parts


class LrFindView(Rendered):
    """The text, with the chart added to the HTML."""

    def __init__(self, result: LrFindResult, width: int | None = None) -> None:
        super().__init__(Group(*_lines(result)), width)
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
        if "text/html" in bundle:
            bundle["text/html"] += chart_svg(self.result)
        return bundle


def lr_find(result: LrFindResult, width: int | None = None) -> LrFindView:
    return LrFindView(result, width)
