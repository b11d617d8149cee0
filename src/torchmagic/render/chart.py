"""The fit-history chart: loss per epoch, and validation accuracy in % when a run has it.

Drawn with matplotlib's object-oriented API (a ``Figure`` saved to a buffer), never
pyplot, so the user's backend is left as it was. The SVG is inlined with a transparent
background; axes, ticks and labels use ``currentColor`` (the notebook's text colour), and
the lines use palette colours that read on light and dark backgrounds alike. Train and
validation differ in colour (blue / amber for the first run: apart for colour-blind
readers too), marker (circle / square) and line (solid / dashed); the legend shows the
three. Text is sized to read at a 900 px window: the figure is drawn at most 6.4 in
wide and scales down to the output's width, never wider. Runs compared (``%tm fits``) start
at epoch 1 each; runs one after the other (``%fine_tune``'s phases) are drawn in sequence,
a dotted line where each later run begins.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.training.fit_events import FitHistory
from .theme import ROLES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INK = "#010203"  # drawn in this colour, then written as currentColor: no line uses it
# (train, val) colours per run, the first pair blue / amber
RUN_COLORS = tuple(
    (ROLES[train].fallback, ROLES[val].fallback)
    for train, val in (("accent", "warning"), ("bn", "ok"), ("info", "error"))
)
TRAIN_STYLE = {"marker": "o", "linestyle": "-"}
VAL_STYLE = {"marker": "s", "linestyle": "--"}
TITLE_SIZE, LABEL_SIZE, TICK_SIZE = 10, 9.5, 9  # points


def _axes_style(ax, title: str, epochs: Sequence[int]) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title, fontsize=TITLE_SIZE, color=INK)
    ax.set_xlabel("epoch", fontsize=LABEL_SIZE, color=INK)
    ax.set_xlim(min(epochs) - 0.25, max(epochs) + 0.25)  # one epoch still gets its tick
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.tick_params(labelsize=TICK_SIZE, colors=INK)
    ax.set_facecolor("none")
    for spine in ax.spines.values():
        spine.set_color(INK)
    if ax.get_legend_handles_labels()[0]:
        legend = ax.legend(fontsize=TICK_SIZE, frameon=False, labelcolor=INK)
        legend.get_frame().set_alpha(0)


def history_chart(histories: Sequence[FitHistory], sequential: bool = False) -> str:
    """The chart as inline SVG, or '' without matplotlib or without epochs."""
    try:
        fig = history_figure(histories, sequential)
    except ImportError:
        return ""
    return "" if fig is None else figure_svg(fig, "fit history chart")


def epoch_offsets(runs: Sequence[FitHistory], sequential: bool) -> list[int]:
    """Where each run's epoch 1 goes on the x axis, less one: 0 for runs compared side
    by side; for runs one after the other (fine_tune's phases), the epochs before it."""
    offsets, before = [], 0
    for h in runs:
        offsets.append(before if sequential else 0)
        before += max(m.epoch for m in h.epochs)
    return offsets


def _mark(axes: Sequence, x: float, label: str) -> None:
    """A dotted line between epochs in every panel, named at the top of the first (a
    block unfrozen, a run begun)."""
    for ax in axes:
        ax.axvline(x, linestyle=":", linewidth=1, color=INK)
    axes[0].annotate(
        label,
        (x, 1),
        xycoords=("data", "axes fraction"),
        fontsize=TICK_SIZE,
        rotation=90,
        va="top",
        ha="right",
        color=INK,
    )


def history_figure(histories: Sequence[FitHistory], sequential: bool = False) -> Figure | None:
    """The chart's figure (None without epochs). ``sequential``: each run continues
    where the one before ended, and a marked line shows where it begins."""
    runs = [h for h in histories if h.epochs]
    if not runs:
        return None
    from matplotlib.figure import Figure

    with_accuracy = any(m.val_accuracy is not None for h in runs for m in h.epochs)
    fig = Figure(figsize=(6.4 if with_accuracy else 3.6, 2.6))
    fig.patch.set_alpha(0)
    loss_ax, *rest = fig.subplots(1, 2 if with_accuracy else 1, squeeze=False)[0]
    offsets = epoch_offsets(runs, sequential)
    epochs: list[int] = []  # every x drawn
    for i, (h, offset) in enumerate(zip(runs, offsets, strict=True)):
        train_color, val_color = RUN_COLORS[i % len(RUN_COLORS)]
        xs = [offset + m.epoch for m in h.epochs]
        epochs.extend(xs)
        loss_ax.plot(
            xs,
            [m.train_loss for m in h.epochs],
            color=train_color,
            label=f"{h.label} train",
            **TRAIN_STYLE,
        )
        if any(m.val_loss is not None for m in h.epochs):
            val = [m.val_loss for m in h.epochs]
            loss_ax.plot(xs, val, color=val_color, label=f"{h.label} val", **VAL_STYLE)
        if rest and any(m.val_accuracy is not None for m in h.epochs):
            accuracy = [None if m.val_accuracy is None else 100 * m.val_accuracy for m in h.epochs]
            rest[0].plot(xs, accuracy, color=val_color, label=f"{h.label} val", **VAL_STYLE)
        if sequential and i:
            _mark((loss_ax, *rest), offset + 0.5, h.label)
        for event in h.unfreezes:  # the block trains from the next epoch on
            _mark((loss_ax, *rest), offset + event.epoch + 0.5, event.block)
    _axes_style(loss_ax, "loss", epochs)
    if rest:
        _axes_style(rest[0], "val accuracy (%)", epochs)
    return fig


def figure_svg(fig: Figure, label: str) -> str:
    """``fig`` as inline SVG in a labelled block: transparent, text as text, and whatever
    was drawn in ``INK`` in the front end's text colour (``currentColor``)."""
    import matplotlib

    fig.tight_layout()
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", transparent=True, metadata={"Date": None})
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :].replace(INK, "currentColor")
    # as wide as drawn, or the output's width when that is narrower (the text scales)
    svg = svg.replace("<svg ", '<svg style="max-width:100%;height:auto" ', 1)
    return f'<div class="torchmagic-chart" role="img" aria-label="{label}">{svg}</div>'
