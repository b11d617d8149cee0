"""Narrow widths: every golden result reads at 60, 80 and 100 columns without a line the
terminal would wrap, and without a table row wrapping its names or numbers.

A table that does not fit hides its least important columns first (``table(hide=…)``,
the priority order each renderer gives) and names them in one line under it; only prose
(a wrapping column wider than ``base._PROSE``) wraps inside its cell, at spaces. The
HTML keeps every column: the browser sizes it (``test_render``).
"""

from __future__ import annotations

import pytest
from rich.table import Table

from test_golden import ALL_CASES, CASES, PROGRESS, _progress
from test_table_words import _column_widths
from torchmagic import render
from torchmagic.render import base
from torchmagic.render.training import epoch_table

WIDTHS = (60, 80, 100)
UNLIMITED = 10_000


def _rendered(case: str, width: int) -> render.Rendered:
    if case in PROGRESS:
        return render.Rendered(_progress(PROGRESS[case]).renderable, width)
    return render.render(CASES[case](), width=width)


def _wrapped_rows(rendered: render.Rendered) -> list[str]:
    """Each table column of ``rendered`` drawn narrower than a body cell of it, where the
    column is not prose, while the table still shows a column it could hide: a row that
    wraps before the table did what it can."""
    console = rendered.console()
    unbounded = console.options.update(width=UNLIMITED, no_wrap=False, height=None)
    tables = [p for p in base._parts(rendered.renderable) if isinstance(p, Table)]
    drawn_tables = [(p, w) for p, w in rendered.drawn(console) if isinstance(p, Table)]
    wrapped = []
    for table, (part, width) in zip(tables, drawn_tables, strict=True):
        hideable = len(table.hide) if isinstance(table, base.HouseTable) else 0
        if len(table.columns) - len(part.columns) == hideable:
            continue  # every column it may hide is hidden: what is left may wrap
        widths = _column_widths(console, part, width)
        for index, (column, drawn) in enumerate(zip(part.columns, widths, strict=True)):
            cells = list(part._get_cells(console, index, column))[1 if part.show_header else 0 :]
            sizes = [console.measure(c.renderable, options=unbounded) for c in cells]
            widest = max((s.maximum for s in sizes), default=0)
            if drawn < widest and not base._prose(column, widest - 1):  # padding: 1
                wrapped.append(f"{part.title!s:.30} · column {column.header or index}")
    return wrapped


@pytest.mark.parametrize("width", WIDTHS)
def test_no_golden_line_is_wider_than_the_terminal(width: int) -> None:
    wide = [
        f"{case}: {len(line)} > {width}: {line!r}"
        for case in ALL_CASES
        for line in str(_rendered(case, width)).splitlines()
        if len(line) > width
    ]
    assert not wide, "\n".join(wide)


@pytest.mark.parametrize("width", WIDTHS)
def test_no_golden_table_row_wraps_a_name_or_number(width: int) -> None:
    wrapped = [
        f"{case}: {row}" for case in ALL_CASES for row in _wrapped_rows(_rendered(case, width))
    ]
    assert not wrapped, "\n".join(wrapped)


class _Unfitted(render.Rendered):
    """Each part drawn as it is, columns hidden by none: as rich alone draws it."""

    def drawn(self, console):
        return [(part, self.width) for part in base._parts(self.renderable)]


def test_the_check_sees_a_row_that_wraps() -> None:
    """The summary at 60 columns drawn with every column wraps its group names."""
    drawn = render.render(CASES["summary"](), width=60)
    assert not _wrapped_rows(drawn)
    assert _wrapped_rows(_Unfitted(drawn.renderable, 60))


def test_hidden_columns_go_in_priority_order_and_are_named() -> None:
    """The summary keeps name, state and params, and hides BatchNorm, group, lr, type in
    that order as the width shrinks; one line names what is hidden."""
    report = CASES["summary"]()
    headers = {}
    for width in (100, 80, 60, 45):
        drawn = render.render(report, width=width)
        table = next(p for p, _ in drawn.drawn(drawn.console()) if isinstance(p, Table))
        headers[width] = [c.header for c in table.columns]
        text = " ".join(str(drawn).split())  # the note may wrap at 45
        hidden = [h for h in headers[100] if h not in headers[width]]
        if not hidden:
            assert "hidden" not in text
        else:
            assert f"… hidden at {width} columns: {', '.join(hidden)} " in text
    assert headers[100] == ["module", "state", "params", "type", "lr", "group", "BatchNorm"]
    assert headers[60][:3] == ["module", "state", "params"]
    order = ["BatchNorm", "group", "lr", "type"]
    for width in (80, 60, 45):
        hidden = [h for h in headers[100] if h not in headers[width]]
        assert hidden == sorted(hidden, key=headers[100].index)
        assert set(hidden) == set(order[: len(hidden)])
    assert len(headers[45]) < len(headers[80]) < len(headers[100])


def test_an_epoch_table_keeps_epoch_and_loss_and_never_cuts_a_number() -> None:
    """Three named groups' lrs at 60 columns: lrs whole (``9.29e-6`` was drawn as
    ``9.29e`` / ``-6``), the other groups' lrs hidden first, then samples/s and time
    (all of them at 60 columns: the head's lr column is wide), and named."""
    from torchmagic.core.training.fit_events import EpochMetrics

    groups = ("bert.embeddings · no_decay", "bert.encoder.layer.1 · decay", "classifier")
    drawn = render.Rendered(
        epoch_table([EpochMetrics(1, 0.6931, 0.7, 0.6, 4096, 12.5, (9.29e-6, 1e-3, 2e-5), groups)]),
        60,
    )
    text = str(drawn)
    assert max(map(len, text.splitlines())) <= 60
    assert "9.29e-6" in text and "0.6931" in text
    footer = " ".join(text[text.index("… hidden at 60 columns") :].split())  # it wraps
    hidden = "time (s), samples/s, lr bert.encoder.layer.1 · decay, lr classifier"
    assert footer == f"… hidden at 60 columns: {hidden}"
    table = next(p for p, _ in drawn.drawn(drawn.console()) if isinstance(p, Table))
    assert [c.header for c in table.columns][:2] == ["epoch", "train loss"]
