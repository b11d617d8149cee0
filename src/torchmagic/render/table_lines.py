"""A table's cells measured and its text lines drawn without a layout pass per cell.

rich draws a table by rendering every cell through the console (a ``Padding`` around a
``Text``, wrapped, justified, cropped, padded, line by line): on a summary of a few
hundred cells that is most of a magic's time. Nearly every cell of a house table is
one line of text that fits its column, and such a line is its text's own segments with
spaces around it. ``table_lines`` draws those cells so, and hands every other cell (one
that wraps, holds another renderable, or has a line break) to the console as rich's
``Table`` would; the column widths, the box and the title are rich's own. The lines
are the ones ``console.render_lines(table, ...)`` gives, style by style
(``tests/render/test_table_lines.py`` compares them on every golden case).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text


def plain_cell(console: Console, cell: RenderableType) -> tuple[int, int, Text] | None:
    """A cell that is one line of text: its indent, the spaces after it and its text; a
    ``str`` as the console turns it into text, a plain ``Padding`` (no style, no blank
    lines, as wide as its cell: the summary's indented module names) by its sides. None
    for anything else."""
    left = right = 0
    if isinstance(cell, Padding):
        if cell.top or cell.bottom or not cell.expand or console.get_style(cell.style):
            return None
        left, right, cell = cell.left, cell.right, cell.renderable
    # a column highlights nothing unless it says so (``_DrawnColumn`` leaves those to rich)
    text = console.render_str(cell, highlight=False) if isinstance(cell, str) else cell
    if not isinstance(text, Text) or "\n" in text.plain:
        return None
    return left, right, text


def measure(console: Console, options: ConsoleOptions, cell: RenderableType) -> Measurement:
    """``Measurement.get`` of a cell, one that is a line of text counted directly: its
    longest word and its length, with its indent and the spaces after it."""
    plain = plain_cell(console, cell)
    if plain is None:
        return Measurement.get(console, options, cell)
    indent, after, text = plain
    widest = max(map(cell_len, text.plain.splitlines()), default=0)
    longest = max(map(cell_len, text.plain.split()), default=widest)
    sides = indent + after
    return Measurement(longest + sides, widest + sides).with_maximum(options.max_width)


def text_style(console: Console, text: Text) -> Style | None:
    """The style of a text as a whole (under its spans); None for none."""
    return console.get_style(text.style) if text.style else None


def text_segments(console: Console, text: Text) -> list[Segment]:
    """One line of text as styled segments, its own style under its spans (as the
    console draws it: ``Text.render`` alone leaves that style out)."""
    return list(Segment.apply_style(text.render(console, end=""), text_style(console, text)))


def table_lines(console: Console, table: Table, width: int) -> list[list[Segment]] | None:
    """``table`` drawn in ``width`` columns: what ``console.render_lines(table,
    console.options.update_width(width), pad=False)`` gives. None for a table whose frame
    this does not draw (an outer edge, a footer, a caption, row styles, blank lines of
    padding): the caller lets rich draw it."""
    if not _plain_frame(table):
        return None
    extra = table._extra_width
    options = console.options.update_width(width)
    drawn_at = width if table.width is None else table.width
    widths = table._calculate_column_widths(console, options.update_width(drawn_at - extra))
    table_width = sum(widths) + extra
    if table_width > width:
        return None
    options = options.update(width=table_width, highlight=table.highlight, height=None)
    lines: list[list[Segment]] = []
    if table.title:
        title = table.title
        if isinstance(title, str):
            style = Style.pick_first(table.title_style, "table.title")
            title = console.render_str(title, style=style, highlight=False)
        lines += console.render_lines(title, options.update(justify=table.title_justify), pad=False)
    safe = console.safe_box if table.safe_box is None else table.safe_box
    box = table.box.substitute(options, safe=safe) if table.box else None
    if box and not table.show_header:
        box = box.get_plain_headed_box()
    border = console.get_style(table.style or "") + console.get_style(table.border_style or "")
    columns = [_DrawnColumn(console, table, options, i, w) for i, w in enumerate(widths)]
    rows = list(zip(*(column.cells for column in columns), strict=False))
    dividers = (
        [
            Segment(box.head_vertical, border),
            Segment(box.mid_vertical, border),
            Segment(box.foot_vertical, border),
        ]
        if box
        else []
    )
    for index, row in enumerate(rows):
        first, last = index == 0, index == len(rows) - 1
        header = first and table.show_header
        drawn = [column.draw(cell, header) for column, cell in zip(columns, row, strict=True)]
        height = max(1, *(len(cell_lines) for cell_lines in drawn))
        if any(len(cell_lines) != height for cell_lines in drawn):
            drawn = [
                column.shape(cell_lines, cell, height, header)
                for column, cell, cell_lines in zip(columns, row, drawn, strict=True)
            ]
        divider = dividers[0 if first else (2 if last else 1)] if box else None
        for line_no in range(height):
            line: list[Segment] = []
            for number, cell_lines in enumerate(drawn):
                if number and divider is not None:
                    line.append(divider)
                line += cell_lines[line_no]
            lines.append(line)
        if box and header:
            lines.append([Segment(box.get_row(widths, "head", edge=False), border)])
        elif box and table.show_lines and not last:
            lines.append([Segment(box.get_row(widths, "row", edge=False), border)])
    return lines


def _plain_frame(table: Table) -> bool:
    """A table whose frame ``table_lines`` draws: columns, and no outer edge, footer,
    caption, row styles, section ends or blank lines of padding (the house tables)."""
    top, _, bottom, _ = table.padding
    return not (
        table.show_edge
        or table.show_footer
        or table.caption
        or table.row_styles
        or table.leading
        or table.collapse_padding
        or top
        or bottom
        or not table.columns
        or any(row.style or row.end_section for row in table.rows)
    )


class _DrawnColumn:
    """Column ``index`` of a table being drawn at ``width`` (its padding included): its
    cells (the header first), the padding and styles rich gives them, and the options
    rich draws a cell that is not one line of text with."""

    def __init__(
        self, console: Console, table: Table, options: ConsoleOptions, index: int, width: int
    ) -> None:
        column = table.columns[index]
        _, right, _, left = table.padding
        if not table.pad_edge:
            left = 0 if index == 0 else left
            right = 0 if index == len(table.columns) - 1 else right
        get_style = console.get_style
        self.console, self.column, self.width = console, column, width
        self.left, self.right = left, right
        self.padded = any(table.padding)  # rich puts every cell in a Padding, even (0, 0)
        self.header_style = get_style(table.header_style or "") + get_style(column.header_style)
        self.cell_style = get_style(column.style or "")
        self.cells: list[RenderableType] = [column.header] if table.show_header else []
        self.cells += column.cells
        self.options = options.update(
            width=width,
            justify=column.justify,
            no_wrap=column.no_wrap,
            overflow=column.overflow,
            height=None,
            highlight=column.highlight,
        )

    def draw(self, cell: RenderableType, header: bool) -> list[list[Segment]]:
        """A cell's lines, each ``width`` wide: a line of text that fits directly, any
        other cell through the console in rich's own ``Padding``."""
        style = self.header_style if header else self.cell_style
        line = self._line(cell, style)
        if line is not None:
            return [line]
        if self.padded:
            cell = Padding(cell, (0, self.right, 0, self.left))
        return self.console.render_lines(cell, self.options, style=style)

    def _line(self, cell: RenderableType, style: Style) -> list[Segment] | None:
        """One line of text that fits the column, as rich justifies and pads it; None
        for any other cell. The spaces a justified text is padded with carry its style;
        the padding around it does not."""
        if self.column.highlight:
            return None  # a highlighter restyles the text
        plain = plain_cell(self.console, cell)
        if plain is None:
            return None
        indent, after, text = plain
        room = self.width - self.left - self.right - indent - after
        length = cell_len(text.plain)
        justify: JustifyMethod = text.justify or self.column.justify
        if (
            length > room
            or "\t" in text.plain
            or (justify in ("right", "center") and text.plain[-1:].isspace())
        ):
            return None  # wraps, has tabs to expand, or rich would strip its trailing spaces
        spare = room - length
        before = spare if justify == "right" else spare // 2 if justify == "center" else 0
        # "default" and "full" leave one line as it is, and the padding fills it
        base = text_style(self.console, text) if justify in ("left", "right", "center") else None
        segments = [
            Segment(" " * (self.left + indent)),
            Segment(" " * before, base),
            *text_segments(self.console, text),
            Segment(" " * (spare - before), base),
            Segment(" " * (after + self.right)),
        ]
        segments = [segment for segment in segments if segment.text]
        return list(Segment.apply_style(segments, style)) if style else segments

    def shape(
        self, lines: list[list[Segment]], cell: RenderableType, height: int, header: bool
    ) -> list[list[Segment]]:
        """A cell's ``lines`` in a row ``height`` lines tall: a header at the bottom, other
        cells as they or their column align, blank lines in the cell's style."""
        style = self.header_style if header else self.cell_style
        vertical = "bottom" if header else getattr(cell, "vertical", None) or self.column.vertical
        if vertical == "top":
            aligned = Segment.align_top(lines, self.width, height, style)
        elif vertical == "middle":
            aligned = Segment.align_middle(lines, self.width, height, style)
        else:
            aligned = Segment.align_bottom(lines, self.width, height, style)
        return Segment.set_shape(aligned, self.width, height)
