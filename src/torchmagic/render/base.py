"""The drawing surface shared by every renderable: a MIME bundle with ``text/plain`` and
``text/html`` drawn from the same lines, by a console created per render (never at import,
never forced to be a terminal), and number formatting."""

from __future__ import annotations

import copy
import html
import io
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
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table

from . import theme

# Front ends style <pre> and <code> in their own ways (JupyterLab: ``.jp-RenderedHTMLCommon
# code {white-space: pre-wrap}``), and a stylesheet rule with !important beats an inline
# style without: no <code>, and the inline rules that keep a row on one line carry
# !important. The block around it scrolls sideways when a table is wider than the output;
# scrolling clips it below too, so the lines are tall enough for the descenders of the last
# one (an underscore sits below the line box of ``line-height:normal`` in some fonts).
_HTML = (
    '<div class="torchmagic-output" style="overflow-x:auto !important;max-width:100%">'
    '<pre style="white-space:pre !important;overflow-wrap:normal !important;'
    "word-break:normal !important;overflow:visible !important;margin:0;padding:0 0 2px 0;"
    "background:transparent;line-height:1.3;font-size:inherit;"
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">"
    "{code}</pre></div>"
)


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

    def lines(self) -> list[list[Segment]]:
        """The renderable drawn at ``width``, as lines of styled segments, trailing blanks
        dropped: the one drawing both MIME types come from."""
        console = self.console()
        lines = [
            _rstrip(Segment.simplify(line))
            for part, width in self.drawn(console)
            for line in console.render_lines(part, console.options.update_width(width), pad=False)
        ]
        while lines and not lines[-1]:
            lines.pop()
        return lines

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
        flattened) with the width it is drawn at; a table as laid out by ``_fitted``."""
        return [_fitted(console, part, self.width) for part in _parts(self.renderable)]

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        types = wanted(include, exclude)
        if not types:
            return {}
        lines = self.lines()
        bundle = {}
        if "text/plain" in types:
            bundle["text/plain"] = _text(lines)
        if "text/html" in types:
            bundle["text/html"] = _HTML.format(code="\n".join(_html_line(ln) for ln in lines))
        return bundle

    def __str__(self) -> str:
        return _text(self.lines())


class Fitted:
    """``renderable`` for a console that draws it itself (the terminal's live %fit view):
    each table laid out as ``Rendered`` lays it out, words whole, where that fits the
    console; one that would need more is left to rich (a live view crops what is wider)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for part in _parts(self.renderable):
            fitted, width = _fitted(console, part, options.max_width)
            if width > options.max_width:
                fitted = part
            yield from console.render(fitted, options)


def _parts(renderable: RenderableType) -> Iterator[RenderableType]:
    """The renderables of a (nested) Group in order, each drawn at its own width."""
    if isinstance(renderable, Group):
        for part in renderable.renderables:
            yield from _parts(part)
    else:
        yield renderable


def _fitted(console: Console, part: RenderableType, width: int) -> tuple[RenderableType, int]:
    """``part`` and the width to draw it at. A table wider than ``width`` is narrowed by
    its wrapping columns, the widest first, none below its longest word (rich would
    narrow a column below it and break the word: a module path cut in two reads as two
    names), and columns that do not wrap (``no_wrap``, the house table's ``whole``) keep
    their widest cell. A table whose words alone are wider is drawn as wide as they need:
    the HTML scrolls sideways, and a terminal wraps the line whole. Anything else is
    drawn at ``width`` as it is."""
    if not isinstance(part, Table) or not part.columns or _sized(part):
        return part, width
    unbounded = console.options.update(width=_UNBOUNDED, no_wrap=False, height=None)
    lows, highs = [], []
    for column in part.columns:
        cells = [column.header] if part.show_header else []
        cells += [*column.cells, *([column.footer] if part.show_footer else [])]
        sizes = [Measurement.get(console, unbounded, cell) for cell in cells]
        high = max((size.maximum for size in sizes), default=0)
        highs.append(high)
        lows.append(high if column.no_wrap else max((s.minimum for s in sizes), default=0))
    # the padding and the rules between columns: the table with every column 0 wide
    probe = copy.copy(part)
    probe.columns = [replace(column, width=0) for column in part.columns]
    probe.min_width = None
    edges = console.measure(probe, options=unbounded).maximum
    room = width - edges
    if sum(highs) <= room:
        return part, width
    widths = lows if sum(lows) >= room else _share(lows, highs, room)
    fitted = copy.copy(part)
    fitted.columns = [replace(c, width=w) for c, w in zip(part.columns, widths, strict=True)]
    return fitted, max(width, sum(widths) + edges)


_UNBOUNDED = 10_000


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
    """Table cells pad with spaces: no line ends in one."""
    kept = list(line)
    while kept and not kept[-1].text.rstrip():
        kept.pop()
    if kept:
        last = kept[-1]
        kept[-1] = Segment(last.text.rstrip(), last.style)
    return kept


def _text(lines: Sequence[Sequence[Segment]]) -> str:
    return "\n".join("".join(segment.text for segment in line) for line in lines)


def _html_line(line: Sequence[Segment]) -> str:
    parts = []
    for segment in line:
        text = html.escape(segment.text, quote=False)
        rules = theme.css(segment.style) if segment.style else ""
        text = f'<span style="{rules}">{text}</span>' if rules else text
        link = segment.style.link if segment.style else None
        parts.append(f'<a href="{html.escape(link)}">{text}</a>' if link else text)
    return "".join(parts)


def human(n: float) -> str:
    """12_345_678 → '12.3M', 256.0 → '256', 0.42 → '0.42' (a slow rate is not 0)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def lr(value: float) -> str:
    """Learning rates as people type them: 0.0001 → '1e-4', 2.45e-06 → '2.45e-6',
    0.01 → '0.01'."""
    if value and abs(value) < 1e-3:
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{value:.3g}"


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def table(
    title: str | None,
    columns: Sequence[tuple[str, JustifyMethod]] = (),
    whole: Collection[str | int] = (),
    **options: Any,
) -> Table:
    """The house table: bold left title, no outer edge; ``columns`` as (name, justify).
    A table is at least as wide as its title, so the title never wraps while it fits.
    The columns in ``whole`` (by name, or by position where names repeat, as blank ones
    do) never wrap: names and numbers with a space in them (a group "layer4 · no_decay",
    a size "4.0 MiB"). The others wrap at spaces, never inside a word (``_fitted``): a
    column of single words, numbers say, only ever wraps its header, so that the table
    still fits a narrow width where its words allow."""
    drawn = Table(
        title=title,
        min_width=len(title) if title else None,
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
        **options,
    )
    for index, (name, justify) in enumerate(columns):
        no_wrap = name in whole or index in whole
        drawn.add_column(name, justify=justify, overflow="fold", no_wrap=no_wrap)
    return drawn
