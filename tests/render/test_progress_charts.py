"""The charts of %fit / %tm fits / %lr_find, and %lr_find's curve drawn in text."""

from __future__ import annotations

import math
import re

import pytest

from torchmagic import render
from torchmagic.core.training.fit_events import EpochMetrics, FitHistory
from torchmagic.core.training.lr_find import STEEPEST, LrFindResult
from torchmagic.render import lr_find as lr_find_view

pytest.importorskip("matplotlib")


def _run(label: str = "fit 1") -> FitHistory:
    epochs = tuple(
        EpochMetrics(e, 1.0 / e, 1.1 / e, 0.5 + e / 10, 8, 1.0, (0.1,)) for e in (1, 2, 3)
    )
    return FitHistory(label, "m", epochs, 3, 24, 3.0)


def _svg(view: render.Rendered) -> str:
    html = view._repr_mimebundle_()["text/html"]
    return html[html.index("<svg") :]


def _line_styles(svg: str) -> list[tuple[str, bool, str]]:
    """(colour, dashed, marker shape) of every drawn line, legend samples included."""
    markers = dict(re.findall(r'<path id="(m[0-9a-f]+)" d="([^"]*)"', svg))
    styles = []
    for chunk in svg.split('<g id="line2d_')[1:]:
        body = chunk.split('<g id="', 1)[0]
        line = re.search(r'<path d="[^"]*"[^>]*style="([^"]*)"', body)
        used = re.search(r'<use xlink:href="#(m[0-9a-f]+)"', body)
        color = re.search(r"stroke: (#[0-9a-f]{6})", line.group(1)) if line else None
        if color and used:
            shape = "circle" if "C " in markers[used.group(1)] else "square"
            styles.append((color.group(1), "stroke-dasharray" in line.group(1), shape))
    return styles


def test_train_and_val_differ_in_colour_marker_and_line_and_the_legend_matches():
    svg = _svg(render.render(_run()))
    styles = _line_styles(svg)
    train = [s for s in styles if not s[1]]
    val = [s for s in styles if s[1]]
    assert set(train) == {(train[0][0], False, "circle")}
    assert set(val) == {(val[0][0], True, "square")}
    assert train[0][0] != val[0][0]
    # each style twice in the loss panel (the line and its legend sample), val also in
    # the accuracy panel, with its legend
    assert len(train) == 2 and len(val) == 4
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert texts.count("fit 1 train") == 1 and texts.count("fit 1 val") == 2


def test_runs_side_by_side_get_their_own_colours():
    svg = _svg(render.render(render.FitRuns((_run("fit 1"), _run("fit 2")))))
    colours = {(s[0], s[1]) for s in _line_styles(svg)}
    assert len(colours) == 4  # train and val of two runs


def test_chart_text_is_large_enough_and_the_chart_fits_the_output():
    for view in (render.render(_run()), render.render(_lr_find())):
        svg = _svg(view)
        sizes = [float(s) for s in re.findall(r"font-size: ([\d.]+)px", svg)]
        assert sizes and min(sizes) >= 9  # in points (the viewBox's unit): 12 px at 1:1
        assert svg.startswith('<svg style="max-width:100%;height:auto"')
        width = float(re.search(r'width="([\d.]+)pt"', svg).group(1))
        assert width <= 6.4 * 72


def _lr_find(suggestion: float | None = None) -> LrFindResult:
    lrs = tuple(1e-6 * 10 ** (i / 10) for i in range(61))
    losses = tuple(
        2.3 - 1.5 / (1 + math.exp(-(i - 25) / 4)) + (0.05 * (i - 45) ** 2 if i > 45 else 0)
        for i in range(61)
    )
    return LrFindResult(
        "model",
        lrs,
        losses,
        losses,
        lrs[25] if suggestion is None else suggestion,
        STEEPEST,
        (lrs[15], lrs[35]),
        0,
        "0",
        (1.0,),
        1e-6,
        1.0,
        61,
        schedulers=("CosineAnnealingLR",),
    )


def test_lr_find_axis_names_the_group():
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", _svg(render.render(_lr_find())))
    assert "lr (group 0)" in texts and "lr (0)" not in texts


def test_lr_find_draws_its_curve_in_text_with_the_suggestion_marked():
    result = _lr_find()
    bundle = render.render(result, 100)._repr_mimebundle_()
    text = bundle["text/plain"]
    lines = text.splitlines()
    (axis,) = [line for line in lines if "└" in line]
    plot = lines[lines.index(axis) - lr_find_view.CURVE_ROWS : lines.index(axis)]
    assert all("┤" in row or "│" in row for row in plot)
    top = result.smoothed[0]  # where the curve started: the divergence goes off the top
    assert [plot[0].split("┤")[0].strip(), plot[-1].split("┤")[0].strip()] == [
        f"{top:.3f}",  # the same decimals: 3 digits for the lower one
        f"{min(result.smoothed):.3f}",
    ]
    mark = axis.index("▲")
    heavy = [i for i, c in enumerate(axis) if c == "━"]
    assert heavy[0] < mark < heavy[-1]  # inside the range where the loss falls
    labels = lines[lines.index(axis) + 1]
    word = render.lr(result.suggestion)
    assert abs(labels.index(word) + len(word) // 2 - mark) <= 1  # the lr under its mark
    assert labels.split()[0] == "1e-6" and "lr (group 0)" in labels
    # the lowest row holds the minimum: its dots are near the minimum's lr
    lowest = min(range(len(result.smoothed)), key=result.smoothed.__getitem__)
    bottom = plot[-1].split("┤")[1]
    first_dot = next(i for i, c in enumerate(bottom) if c != "\u2800")
    assert first_dot / len(plot[0].split("┤")[1]) < lowest / len(result.lrs) + 0.1
    # HTML: the chart instead of the text curve
    assert "<svg" in bundle["text/html"] and "▲" not in bundle["text/html"]


def _diverging() -> LrFindResult:
    """Losses of 0.5-0.9 that blow up at the end (a huge last loss, then a NaN)."""
    falling = [0.9 - 0.4 * i / 30 for i in range(31)]
    losses = (*falling, 0.6, 0.9, 3.0, 40.0, 150.0, float("nan"))
    lrs = tuple(1e-6 * 10 ** (i / 6) for i in range(len(losses)))
    return LrFindResult(
        "model",
        lrs,
        losses,
        losses,
        lrs[15],
        STEEPEST,
        (lrs[2], lrs[28]),
        0,
        "0",
        (1.0,),
        1e-6,
        1.0,
        len(losses),
    )


def _y_limits(svg: str) -> tuple[float, float]:
    """The y axis's tick values, lowest and highest."""
    axis = svg.split('<g id="matplotlib.axis_2">', 1)[1]
    ticks = [float(t.replace("−", "-")) for t in re.findall(r"<text[^>]*>([−0-9.]+)</text>", axis)]
    return min(ticks), max(ticks)


def test_lr_find_chart_fits_its_y_axis_to_the_curve_not_the_divergent_tail():
    result = _diverging()
    low, high = lr_find_view.loss_span(result, raw=True, headroom=lr_find_view.HEADROOM)
    assert 0.45 < low < 0.5 and 0.9 < high < 0.95  # the curve's 0.5-0.9 and a little room
    ticks = _y_limits(_svg(render.render(result)))
    assert 0.4 <= ticks[0] and ticks[1] <= 1.0  # not -6 to 0.8: the curve fills the axis
    text = str(render.render(result, 100))
    assert "the loss falls between lrs 2.15e-6 and" in text  # lrs, said as lrs
    plot = [line for line in text.splitlines() if "┤" in line]
    assert [row.split("┤")[0].strip() for row in plot] == ["0.900", "0.500"]


def test_lr_find_chart_of_a_loss_that_never_fell_shows_its_whole_rise():
    """The quickstart's %lr_find after fine-tuning: the loss only rises, to 4x its minimum
    where the run stops; the axis was fitted to its first steps and the curve left it."""
    losses = tuple(0.116 * (1 + 3 * (i / 35) ** 2) + 0.004 * (i % 2) for i in range(36))
    lrs = tuple(1e-7 * 10 ** (i / 5) for i in range(len(losses)))
    result = LrFindResult(
        "model", lrs, losses, losses, None, STEEPEST, None, 0, "0", (1.0,), 1e-7, 1.0, 40
    )
    low, high = lr_find_view.loss_span(result, raw=True, headroom=lr_find_view.HEADROOM)
    assert low < min(losses) and high > max(losses)  # every loss of the run in view
    assert high - low < 1.3 * (max(losses) - min(losses))  # and no more than a little room


def test_lr_find_text_curve_fits_a_narrow_terminal_and_stands_in_for_a_missing_chart(
    monkeypatch,
):
    text = str(render.render(_lr_find(), 60))
    assert max(len(line) for line in text.splitlines()) <= 60 and "▲" in text
    monkeypatch.setattr(lr_find_view, "chart_svg", lambda result: "")
    html = render.render(_lr_find(), 100)._repr_mimebundle_()["text/html"]
    assert "▲" in html and "<svg" not in html


def test_lr_find_says_the_bound_schedulers_were_left_alone():
    text = str(render.render(_lr_find(), 100))
    assert "schedulers (CosineAnnealingLR: not stepped) and random state restored" in text
