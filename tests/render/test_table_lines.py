"""``table_lines`` draws a table's text lines as rich draws them, character by character
and style by style: every table of every golden case at three widths (as laid out for
the width, and as given), and tables made to reach what the house tables rarely do
(wrapped cells and headers, centred and styled cells, rules between rows, no box).
``measure`` sizes every golden cell as ``Measurement.get`` does."""

from __future__ import annotations

import pytest
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from test_golden import ALL_CASES
from test_golden_widths import WIDTHS, _rendered
from torchmagic.render import base
from torchmagic.render.base import table
from torchmagic.render.table_lines import measure, table_lines


def _styled(lines: list[list[Segment]]) -> list[list[tuple[str, Style]]]:
    """Each line as (character, style) pairs, trailing blanks dropped: what a terminal
    shows (no style and the null style look the same)."""
    shown = []
    for line in lines:
        chars = [(c, s.style or Style.null()) for s in line for c in s.text]
        while chars and chars[-1][0] == " ":
            chars.pop()
        shown.append(chars)
    while shown and not shown[-1]:
        shown.pop()
    return shown


def _by_rich(console: Console, drawn: Table, width: int) -> list[list[Segment]]:
    return console.render_lines(drawn, console.options.update_width(width), pad=False)


def _assert_same(console: Console, drawn: Table, width: int) -> None:
    ours = table_lines(console, drawn, width)
    assert ours is not None, "a house table's frame is drawn"
    assert _styled(ours) == _styled(_by_rich(console, drawn, width))


@pytest.mark.parametrize("width", WIDTHS)
def test_every_golden_table_is_drawn_as_rich_draws_it(width: int) -> None:
    compared = 0
    for case in ALL_CASES:
        rendered = _rendered(case, width)
        console = rendered.console()
        laid_out = [(p, w) for p, w in rendered.drawn(console) if isinstance(p, Table)]
        given = [(p, width) for p in base._parts(rendered.renderable) if isinstance(p, Table)]
        for drawn, at in laid_out + given:
            if drawn.columns:
                _assert_same(console, drawn, at)
                compared += 1
    assert compared > 50


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_golden_cell_is_measured_as_rich_measures_it(case: str) -> None:
    rendered = _rendered(case, 100)
    console = rendered.console()
    unbounded = console.options.update(width=10_000, no_wrap=False, height=None)
    for drawn in base._parts(rendered.renderable):
        if isinstance(drawn, Table):
            for column in drawn.columns:
                for cell in [column.header, *column.cells]:
                    assert measure(console, unbounded, cell) == Measurement.get(
                        console, unbounded, cell
                    ), cell


def test_indented_and_empty_cells_are_measured_as_rich_measures_them() -> None:
    console = _console()
    options = console.options.update(width=30)
    for cell in ("", "two words", Padding("", (0, 0, 0, 4)), Padding("a b", (0, 2, 0, 3))):
        assert measure(console, options, cell) == Measurement.get(console, options, cell)


def _console(width: int = 40) -> Console:
    return base.Rendered(Text(""), width).console()


def test_wrapped_cells_and_headers_are_drawn_as_rich_draws_them() -> None:
    drawn = table("a title longer than the cells", [("name", "left"), ("a long header", "right")])
    drawn.add_row("layer1", "words that wrap inside the column")
    drawn.add_row(Padding("conv", (0, 0, 0, 4)), Text("7.1k", style="green"))
    drawn.add_row("", "")
    for width in (12, 20, 30, 80):
        _assert_same(_console(), drawn, width)


def test_justified_styled_and_ruled_tables_are_drawn_as_rich_draws_them() -> None:
    drawn = table(
        None, [("left", "left"), ("centre", "center"), ("right", "right")], show_lines=True
    )
    drawn.columns[1].header_style = "italic"
    drawn.columns[2].style = "red"
    drawn.add_row(Text("ok", style="bold green"), Text.assemble(("a", "blue"), " b"), "1.0 MiB")
    drawn.add_row("tab\there", "trailing ", Text("x", justify="left"))
    drawn.add_row(Text("base", style="dim") + Text(" span", style="yellow"), "—", "")
    for width in (10, 24, 60):
        _assert_same(_console(), drawn, width)


def test_a_table_without_box_or_header_is_drawn_as_rich_draws_it() -> None:
    drawn = table(None, [("a", "left"), ("b", "left")], show_header=False, box=None)
    drawn.add_row("--flag", "what it does, in words that wrap at a narrow width")
    for width in (16, 40):
        _assert_same(_console(), drawn, width)


def test_a_frame_it_does_not_draw_is_left_to_rich() -> None:
    framed = Table("a", show_edge=True)
    footed = Table("a", show_footer=True)
    for drawn in (framed, footed, Table()):
        assert table_lines(_console(), drawn, 40) is None
