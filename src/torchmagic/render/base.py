"""The drawing surface shared by every renderable: a MIME bundle with ``text/plain`` and
``text/html`` drawn from the same lines, by a console created per render (never at import,
never forced to be a terminal), and number formatting."""

from __future__ import annotations

import copy
import html
import io
import re
import shutil
import sys
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from rich.console import (
    Console,
    ConsoleOptions,
    Group,
    JustifyMethod,
    RenderableType,
    RenderResult,
)
from rich.segment import Segment
from rich.table import Column, Table
from rich.text import Text

from ..core.numbers import short
from . import html_narrow, theme, units
from .table_lines import measure, plain_cell, table_lines, text_segments

# HTML: every table a real <table> the browser sizes to the output (max-width 100%: its
# prose columns wrap at spaces, never inside a word; names and numbers never wrap), the
# most important columns on the left; the lines between tables in a <pre> that wraps at
# spaces. Front ends style <pre>, <code> and <table> in their own ways (JupyterLab:
# ``.jp-RenderedHTMLCommon code {white-space: pre-wrap}``, centred tables with 0.5em
# cells): no <code>, and inline rules (!important where a stylesheet rule may carry it).
# The block around it scrolls sideways when a table's words alone are wider than the
# output. Lines are tall enough for the descenders of the last one (an underscore sits
# below the line box of ``line-height:normal`` in some fonts, and the scrolling block
# clips it).
_FONT = "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace;font-size:inherit"
_HTML = (
    '<div class="torchmagic-output" style="overflow-x:auto !important;max-width:100%">'
    "{blocks}</div>"
)
_PRE = (
    '<pre style="white-space:pre-wrap !important;overflow-wrap:normal !important;'
    "word-break:normal !important;overflow:visible !important;margin:0;padding:0 0 2px 0;"
    f'background:transparent;line-height:1.3;{_FONT}">{{code}}</pre>'
)
_TABLE = (
    '<table class="torchmagic-table" style="border-collapse:collapse;border:none;'
    "table-layout:auto;width:auto;max-width:100%;margin:0 0 0.2em 0;line-height:normal;"
    f'{_FONT}">{{head}}<tbody>{{rows}}</tbody></table>'
)
# a title above its table, not a <caption>: a caption wraps at the table's width, which
# may be wider than the output
_FACTS = (
    '<div class="torchmagic-facts" style="white-space:normal;margin:0;padding:0 0 2px 0;'
    f'line-height:1.3;{_FONT}">{{}}</div>'
)
_TITLE = (
    f'<div class="torchmagic-title" style="font-weight:bold;white-space:normal;'
    f'line-height:normal;{_FONT}">{{}}</div>'
)

# a run between spaces, a number with its unit one run ("4.0 MiB", "0 %")
_NUMBER_WORD = rf"[^ ]*\d {units.UNITS}[^ ]*"  # a number with its unit, as one word
_WORD = re.compile(rf"{_NUMBER_WORD}|[^ ]+")
_NUMBER = re.compile(_NUMBER_WORD)
_NO_WRAP = r'<span style="white-space:nowrap">\g<0></span>'
RULE = "1px solid rgba(128,128,128,.45)"  # grey at half strength reads on any theme
FONT = _FONT


DEFAULT_WIDTH = 100
MIME_TYPES = ("text/plain", "text/html")


def wanted(include: Collection[str] | None, exclude: Collection[str] | None) -> list[str]:
    """The MIME types of ours a frontend asked for (IPython: empty ``include`` means all)."""
    return [m for m in MIME_TYPES if (not include or m in include) and m not in (exclude or ())]


def in_kernel() -> bool:
    """True inside a Jupyter kernel: the output goes to a notebook, not a terminal."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return getattr(shell, "kernel", None) is not None


def default_width() -> int:
    """The width when none is configured: the terminal's in a terminal; in a notebook
    ``DEFAULT_WIDTH``, and the HTML scrolls sideways when the window is narrower."""
    if in_kernel():
        return DEFAULT_WIDTH
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


class Rendered:
    """A renderable with its own MIME bundle; ``display()`` it, or ``str()`` it.

    ``width`` None or 0 means ``default_width()``."""

    def __init__(self, renderable: RenderableType, width: int | None = None) -> None:
        self.renderable = renderable
        self.width = width or default_width()

    def lines(self, console: Console | None = None) -> list[list[Segment]]:
        """The renderable drawn at ``width``, as lines of styled segments, trailing blanks
        dropped: what ``text/plain`` is made of."""
        return self._drawing(console).lines()

    def console(self) -> Console:
        """The console every drawing of this renderable goes through."""
        # markup off: module names, commands and usage strings contain [brackets];
        # force_jupyter off: in a kernel rich would otherwise display its own copy;
        # a colour system, or a progress bar leaves out its empty part
        return Console(
            force_jupyter=False,
            color_system="truecolor",
            force_terminal=False,
            width=self.width,
            file=io.StringIO(),
            markup=False,
            highlight=False,
            emoji=False,
        )

    def drawn(self, console: Console) -> list[tuple[RenderableType, int]]:
        """What ``lines`` draws, in order: each part of the renderable (a nested Group
        flattened) with the width it is drawn at; a table as laid out by ``_fitted``
        (with the line naming the columns it hid, if any)."""
        drawing = self._drawing(console)
        return [placed for index in range(len(drawing.parts)) for placed in drawing.placed(index)]

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        types = wanted(include, exclude)
        if not types:
            return {}
        drawing = self._drawing()  # one for both types: each table measured once
        bundle = {}
        if "text/plain" in types:
            bundle["text/plain"] = _text(drawing.lines())
        if "text/html" in types:
            bundle["text/html"] = drawing.html()
        return bundle

    def html(self) -> str:
        """The ``text/html`` drawing: tables as <table> with every column, the other
        parts as the lines ``lines`` draws them in."""
        return self._drawing().html()

    def __str__(self) -> str:
        return _text(self.lines())

    def _drawing(self, console: Console | None = None) -> Drawing:
        return Drawing(self.renderable, self.width, console or self.console())


class Drawing:
    """One ``Rendered`` drawn once for every MIME type: its parts listed once, each
    table's columns measured once, each part's lines drawn once (the HTML puts the
    text drawing's lines of the parts that are not tables in a <pre>). It lives as long
    as one bundle is made, and holds the parts its measurements are keyed by."""

    def __init__(self, renderable: RenderableType, width: int, console: Console) -> None:
        self.console = console
        self.width = width
        self.parts = list(_parts(renderable))
        self._sizes: dict[int, tuple[list[int], list[int]]] = {}  # by id of a table of parts
        self._placed: dict[int, list[tuple[RenderableType, int]]] = {}  # by part index
        self._lines: dict[int, list[list[Segment]]] = {}  # by part index

    def sizes(self, table: Table) -> tuple[list[int], list[int]]:
        """``_column_sizes`` of a table of ``parts``, measured once."""
        if id(table) not in self._sizes:
            self._sizes[id(table)] = _column_sizes(self.console, table)
        return self._sizes[id(table)]

    def placed(self, index: int) -> list[tuple[RenderableType, int]]:
        """Part ``index`` as ``_fitted`` lays it out; a ``Facts`` at the width its table
        is drawn at."""
        if index not in self._placed:
            part = self.parts[index]
            if isinstance(part, Facts):
                self._placed[index] = [(part, self._table_width(part.table))]
            elif isinstance(part, Table) and not _drawn_as_text(part):
                self._placed[index] = _fitted(self.console, part, self.width, self.sizes(part))
            else:
                self._placed[index] = [(part, self.width)]
        return self._placed[index]

    def _table_width(self, table: Table) -> int:
        """How wide ``table`` is drawn, after it hid or narrowed columns to fit (what a
        line under it lines up with): one of ``parts``, or drawn alone."""
        held = [i for i, part in enumerate(self.parts) if part is table]
        if held:
            fitted, drawn_at = self.placed(held[0])[0]
        else:
            fitted, drawn_at = _fitted(self.console, table, self.width)[0]
        options = self.console.options.update(width=drawn_at)
        return max(min(self.console.measure(fitted, options=options).maximum, drawn_at), 1)

    def part_lines(self, index: int) -> list[list[Segment]]:
        """Part ``index`` drawn as ``placed`` lays it out, each line without trailing
        blanks."""
        if index not in self._lines:
            self._lines[index] = [
                _rstrip(Segment.simplify(line))
                for part, width in self.placed(index)
                for line in self._draw(part, width)
            ]
        return self._lines[index]

    def _draw(self, part: RenderableType, width: int) -> list[list[Segment]]:
        """``part``'s lines at ``width``: a table's from its column widths
        (``table_lines``), anything else (and a table with a frame it leaves to rich) by
        the console."""
        drawn = table_lines(self.console, part, width) if isinstance(part, Table) else None
        if drawn is None:
            options = self.console.options.update_width(width)
            drawn = self.console.render_lines(part, options, pad=False)
        return drawn

    def lines(self) -> list[list[Segment]]:
        """Every part's lines, trailing blank lines dropped."""
        lines = [line for index in range(len(self.parts)) for line in self.part_lines(index)]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def html(self) -> str:
        """Tables as <table> with every column (``_html_table``), parts that draw their
        own HTML as they do, the other parts' lines in <pre> blocks."""
        blocks: list[str] = []
        text: list[list[Segment]] = []
        for index, part in enumerate(self.parts):
            if isinstance(part, (Table, OwnHtml)) and not _drawn_as_text(part):
                if text:
                    blocks.append(_pre(text))
                    text = []
                if isinstance(part, OwnHtml):
                    blocks.append(part.html())
                else:
                    blocks.append(_html_table(self.console, part, self.sizes(part)))
                continue
            text += self.part_lines(index)
        while text and not text[-1]:
            text.pop()
        if text:
            blocks.append(_pre(text))
        return _HTML.format(blocks="".join(blocks))


def _pre(lines: list[list[Segment]]) -> str:
    """Text lines as one <pre>. HTML drops a newline right after ``<pre>``, so a leading
    blank line (a closed progress block's) gets one more, or the block loses a line."""
    code = "\n".join(_html_line(line) for line in lines)
    return _PRE.format(code="\n" + code if code.startswith("\n") else code)


class Fitted:
    """``renderable`` for a console that draws it itself (the terminal's live %fit view):
    each table laid out as ``Rendered`` lays it out (least important columns hidden,
    words and numbers whole) where that fits the console; one whose key columns alone
    need more is left to rich (a live view crops what is wider)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        drawing = Drawing(self.renderable, options.max_width, console)
        for index, part in enumerate(drawing.parts):
            drawn = drawing.placed(index)
            if any(width > options.max_width for _, width in drawn):
                drawn = [(part, options.max_width)]
            for fitted, width in drawn:
                for segment in console.render(fitted, options.update_width(width)):
                    yield segment._replace(text=units.unglue(segment.text))


def _parts(renderable: RenderableType) -> Iterator[RenderableType]:
    """The renderables of a (nested) Group in order, each drawn at its own width, its
    numbers glued to their units (``units``); a ``Facts`` names its table as drawn."""
    glued: dict[int, Table] = {}  # by id of a table as given: its glued copy
    stack = [renderable]
    while stack:
        part = stack.pop()
        if isinstance(part, Group):
            stack += reversed(part.renderables)
        elif isinstance(part, Facts):
            yield Facts(part.facts, glued.get(id(part.table), part.table))
        else:
            drawn = units.glue(part)
            if isinstance(drawn, Table):
                glued[id(part)] = drawn
            yield drawn


def _fitted(
    console: Console,
    part: Table,
    width: int,
    sizes: tuple[list[int], list[int]] | None = None,
) -> list[tuple[RenderableType, int]]:
    """``part`` as drawn in ``width`` columns and the width to draw it at, then the line
    naming the columns it hid. ``sizes``: ``_column_sizes`` of it, when the caller has
    them.

    A table wider than ``width`` first hides its least important columns
    (``HouseTable.hide``, in order) until each row fits on one line (prose wrapped down
    to ``_PROSE`` columns). Still wider, it is narrowed by its wrapping columns, the
    widest first, none below its longest word (rich would narrow a column below it and
    break the word: a module path cut in two reads as two names), and columns that do
    not wrap (``no_wrap``, the house table's ``whole``) keep their widest cell. A table
    whose words alone are wider is drawn as wide as they need: the HTML scrolls
    sideways, and a terminal wraps the line whole. Every column of the drawn copy has
    its width set, so rich lays it out without measuring its cells again."""
    lows, highs = sizes = sizes or _column_sizes(console, part)
    gone = {c for below, c in hide_widths(console, part, sizes) if width < below}
    shown = [i for i in range(len(part.columns)) if i not in gone]
    hidden = [i for i in range(len(part.columns)) if i in gone]
    edges = _edges(part, len(shown))
    drawn_at, room = width, width - edges
    widths = [highs[i] for i in shown]
    if sum(widths) > room:
        shown_lows = [lows[i] for i in shown]
        widths = shown_lows if sum(shown_lows) >= room else _share(shown_lows, widths, room)
        drawn_at = max(width, sum(widths) + edges)
    fitted = copy.copy(part)
    # rich measures a column by its _index (the last one has no right padding)
    fitted.columns = [
        replace(part.columns[i], _index=n, width=w)
        for n, (i, w) in enumerate(zip(shown, widths, strict=True))
    ]
    if not hidden:
        return [(fitted, drawn_at)]
    names = ", ".join(_header(part.columns[i].header) or f"column {i + 1}" for i in hidden)
    note = Text(f"… hidden at {width} columns: {names}", style=theme.style("dim"))
    return [(fitted, drawn_at), (note, width)]


def hide_widths(
    console: Console, table: Table, sizes: tuple[list[int], list[int]] | None = None
) -> list[tuple[int, int]]:
    """(width, column) for each column ``table`` hides (``HouseTable.hide``, in order):
    drawn narrower than ``width``, the table hides it, as every column before it, so
    that each row fits on one line (prose wrapped down to ``_PROSE`` columns).
    ``sizes``: ``_column_sizes`` of the table, when the caller has them."""
    order = list(table.hide) if isinstance(table, HouseTable) else []
    if not order:
        return []
    lows, highs = sizes or _column_sizes(console, table)
    # a row wraps where a column is narrower than its widest cell; prose (``_prose``)
    # may wrap down to _PROSE before a column is hidden for it
    needs = [min(high, max(low, _PROSE)) for low, high in zip(lows, highs, strict=True)]
    shown = list(range(len(table.columns)))
    widths = []
    for column in order:
        widths.append((sum(needs[i] for i in shown) + _edges(table, len(shown)), column))
        shown.remove(column)
    return widths


def _column_sizes(console: Console, table: Table) -> tuple[list[int], list[int]]:
    """Each column's narrowest width that keeps its words whole (its widest cell where
    it does not wrap), and its widest cell: header, cells and footer."""
    unbounded = console.options.update(width=_UNBOUNDED, no_wrap=False, height=None)
    lows, highs = [], []
    for column in table.columns:
        cells = [column.header] if table.show_header else []
        cells += [*column.cells, *([column.footer] if table.show_footer else [])]
        sizes = [measure(console, unbounded, cell) for cell in cells]
        high = max((size.maximum for size in sizes), default=0)
        highs.append(high)
        lows.append(high if column.no_wrap else max((s.minimum for s in sizes), default=0))
    return lows, highs


def _prose(column: Column, high: int) -> bool:
    """A column that wraps and whose widest cell is longer than ``_PROSE``: sentences,
    not a name or a number with a space in it."""
    return not column.no_wrap and high > _PROSE


def _edges(table: Table, count: int) -> int:
    """The padding and the rules of ``table`` drawn with ``count`` of its columns: what
    rich adds to the cells' widths (each column's padding, by its position, and the box
    between them); the columns' own widths do not change it."""
    probe = copy.copy(table)
    probe.columns = table.columns[:count]
    return max(sum(probe._get_padding_width(n) for n in range(count)) + probe._extra_width, 0)


def _header(header: RenderableType) -> str:
    return header.plain if isinstance(header, Text) else str(header)


_UNBOUNDED = 10_000
_PROSE = 32


def _drawn_as_text(part: Table | OwnHtml) -> bool:
    """A part whose HTML is its text lines: a table without columns or one that sizes
    itself."""
    return isinstance(part, Table) and (not part.columns or _sized(part))


def _sized(table: Table) -> bool:
    """A table that sizes itself (a width, an expand, a column's own width limits): rich
    lays it out alone."""
    return (
        table.width is not None
        or table.expand
        or any(
            c.width is not None or c.min_width is not None or c.max_width is not None or c.ratio
            for c in table.columns
        )
    )


def _share(lows: Sequence[int], highs: Sequence[int], room: int) -> list[int]:
    """Column widths that add up to ``room`` (``sum(lows) <= room < sum(highs)``): every
    column as wide as its widest cell up to one cap, never narrower than its ``low``;
    the cap as high as ``room`` allows, the columns at it given the columns left over."""

    def at(cap: int) -> list[int]:
        return [min(high, max(low, cap)) for low, high in zip(lows, highs, strict=True)]

    below, above = 0, max(highs)  # sum(at(below)) <= room < sum(at(above))
    while above - below > 1:
        middle = (below + above) // 2
        below, above = (middle, above) if sum(at(middle)) <= room else (below, middle)
    widths = at(below)
    spare = room - sum(widths)
    for index, high in enumerate(highs):
        if spare and widths[index] == below < high:
            widths[index] += 1
            spare -= 1
    return widths


def _rstrip(line: Iterable[Segment]) -> list[Segment]:
    """Table cells pad with spaces: no line ends in one. Glued spaces (``units``) back."""
    kept = [s._replace(text=units.unglue(s.text)) for s in line]
    while kept and not kept[-1].text.rstrip():
        kept.pop()
    if kept:
        last = kept[-1]
        kept[-1] = Segment(last.text.rstrip(), last.style)
    return kept


def _text(lines: Sequence[Sequence[Segment]]) -> str:
    return "\n".join("".join(segment.text for segment in line) for line in lines)


def _html_line(line: Sequence[Segment], words: bool = False) -> str:
    """One drawn line as HTML, each number with its unit in a no-wrap span; ``words``:
    each run between spaces too."""
    parts = []
    for segment in line:
        text = html.escape(segment.text, quote=False)
        # a <pre> wraps at spaces, but not between a number and its unit
        text = (_WORD if words else _NUMBER).sub(_NO_WRAP, text)
        rules = theme.css(segment.style) if segment.style else ""
        text = f'<span style="{rules}">{text}</span>' if rules else text
        link = segment.style.link if segment.style else None
        parts.append(f'<a href="{html.escape(link)}">{text}</a>' if link else text)
    return "".join(parts)


def _html_table(console: Console, table: Table, sizes: tuple[list[int], list[int]]) -> str:
    """``table`` as an HTML table: its title above it, its header bold over a rule, its
    columns apart by thin rules. Prose (``_prose``) wraps at spaces only (each word kept
    whole); every other column keeps each cell on one line (indents kept), so a row
    wraps only its sentences. In a block of its own that hides columns at a narrow
    output as the text drawing does (``html_narrow``).
    The header of a key column (one no width hides) carries ``data-tm-key``: what
    ``tools/ui_check.py`` finds inside the visible output. ``sizes``: its
    ``_column_sizes``."""
    columns = table.columns
    last = len(columns) - 1
    hidden = set(table.hide) if isinstance(table, HouseTable) else set()
    highs = sizes[1]
    prose = [_prose(column, high) for column, high in zip(columns, highs, strict=True)]
    heads = [_html_cell(console, c.header, whole=True) for c in columns]
    cells = [
        [_html_cell(console, cell, whole=not prose[i]) for cell in c.cells]
        for i, c in enumerate(columns)
    ]
    title = _TITLE.format(_html_cell(console, table.title, whole=False)) if table.title else ""
    scope = html_narrow.scope_of(title + "".join(heads) + "".join(map("".join, cells)))

    def attributes(index: int, column: Column, head: bool) -> str:
        justify = column.justify if column.justify in ("left", "right", "center") else "left"
        wrap = "normal" if prose[index] and not head else "pre"
        left, right = ("0" if index == 0 else "1ch"), ("0" if index == last else "1ch")
        rule = f";border-left:{RULE}" if index else ""
        key = f' class="{html_narrow.column_class(scope, index)}"' if index in hidden else ""
        if head and index not in hidden:
            key = " data-tm-key"
        return (
            f'{key} style="padding:0 {right} 0 {left};vertical-align:top;'
            f"text-align:{justify};white-space:{wrap}{rule}"
        )

    head = ""
    if table.show_header:
        row = "".join(
            f'<th{attributes(i, c, True)};font-weight:bold;border-bottom:{RULE}">{heads[i]}</th>'
            for i, c in enumerate(columns)
        )
        head = f"<thead><tr>{row}</tr></thead>"
    rows = []
    for r in range(table.row_count):
        between = f";border-top:{RULE}" if table.show_lines and r else ""
        row = "".join(
            f'<td{attributes(i, c, False)}{between}">{cells[i][r]}</td>'
            for i, c in enumerate(columns)
        )
        rows.append(f"<tr>{row}</tr>")
    body = title + _TABLE.format(head=head, rows="".join(rows))
    names = [_header(c.header) or f"column {i + 1}" for i, c in enumerate(columns)]
    return html_narrow.block(scope, body, hide_widths(console, table, sizes), names, _FONT)


def _html_cell(console: Console, cell: RenderableType, whole: bool) -> str:
    """A cell's content drawn unbounded (the browser wraps it), lines apart by <br>;
    ``whole`` False: each word kept on one line, as browsers otherwise also break after
    a hyphen or a slash (inside ``1e-4…0.001`` or ``samples/s``). A one-line text (most
    cells) is drawn from its own segments, without a layout pass; so is one indented by
    a plain ``Padding`` (the summary's module names), its indent as spaces."""
    plain = plain_cell(console, cell)
    if plain is not None:
        indent, _, text = plain
        segments = _rstrip(Segment.simplify([Segment(" " * indent), *text_segments(console, text)]))
        return _html_line(segments, words=not whole) if segments else ""
    options = console.options.update(width=_UNBOUNDED, justify="left", no_wrap=True, height=None)
    lines = [_rstrip(Segment.simplify(ln)) for ln in console.render_lines(cell, options, pad=False)]
    while lines and not lines[-1]:
        lines.pop()
    return "<br>".join(_html_line(line, words=not whole) for line in lines)


def human(n: float) -> str:
    """12_345_678 → '12.3M', 256.0 → '256', 0.42 → '0.42' (a slow rate is not 0)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def lr(value: float) -> str:
    """Learning rates as people type them: 0.0001 → '1e-4', 2.45e-06 → '2.45e-6',
    0.01 → '0.01' (``core.numbers.short``, the one style of every output)."""
    return short(value)


def share(percent: float) -> str:
    """A share in percent, one decimal: '75.1%'; a share too small for it, but not
    none, '<0.1%' (a 5.13k head of 11.2M is not 0.0%)."""
    return "<0.1%" if 0 < percent < 0.05 else f"{percent:.1f}%"


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


class HouseTable(Table):
    """A house table: a rich Table that knows which columns give way at a narrow width.

    ``hide``: column positions, the first hidden first; the columns not in it always
    show. Columns are in the order of importance too, so what stays is on the left."""

    def __init__(self, *args: Any, hide: Sequence[int] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hide = tuple(hide)


class OwnHtml:
    """A part that draws its own ``text/html`` (the browser lays it out at a width
    the text drawing cannot know) instead of its text lines in a <pre>."""

    def html(self) -> str:
        raise NotImplementedError


def html_text(text: Text) -> str:
    """One line of styled text as HTML, each word (a number with its unit) kept whole."""
    console = Console(file=io.StringIO(), color_system="truecolor", markup=False)
    return _html_line(_rstrip(Segment.simplify(text_segments(console, text))), words=True)


class Facts(OwnHtml):
    """Facts joined by `` · `` in lines no wider than ``table`` is drawn (``Drawing``
    draws it at that width, with the columns a narrow width hides hidden): a totals line
    under a table wraps between facts, never inside one; in HTML the browser wraps them
    so, at the width of the cell."""

    def __init__(self, facts: Sequence[str], table: Table) -> None:
        self.facts = facts
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = [""]
        for fact in self.facts:
            joined = f"{lines[-1]} · {fact}" if lines[-1] else fact
            if len(joined) <= options.max_width or not lines[-1]:
                lines[-1] = joined
            else:
                lines.append(fact)
        for line in lines:
            yield Text(line)

    def html(self) -> str:
        spans = (
            f'<span style="white-space:nowrap">{html.escape(fact, quote=False)}</span>'
            for fact in self.facts
        )
        return _FACTS.format("&nbsp;· ".join(spans))  # a line may end in ·, not begin


def table(
    title: str | None,
    columns: Sequence[tuple[str, JustifyMethod]] = (),
    whole: Collection[str | int] = (),
    hide: Sequence[str | int] = (),
    **options: Any,
) -> HouseTable:
    """The house table: bold left title, no outer edge; ``columns`` as (name, justify),
    the most important first. A table is at least as wide as its title, so the title
    never wraps while it fits. The columns in ``whole`` (by name, or by position where
    names repeat, as blank ones do) never wrap: names and numbers with a space in them
    (a group "layer4 · no_decay", a size "4.0 MiB"). The others wrap at spaces, never
    inside a word (``_fitted``): a column of single words, numbers say, only ever wraps
    its header, so that the table still fits a narrow width where its words allow.
    ``hide`` (names or positions): the columns a narrow width hides before any row
    wraps, least important first; a line under the table names them."""
    names = [name for name, _ in columns]
    drawn = HouseTable(
        title=title,
        min_width=len(title) if title else None,
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
        hide=[key if isinstance(key, int) else names.index(key) for key in hide],
        **options,
    )
    for index, (name, justify) in enumerate(columns):
        no_wrap = name in whole or index in whole
        drawn.add_column(name, justify=justify, overflow="fold", no_wrap=no_wrap)
    return drawn
