"""A number is never split from its unit ("2.4 s", "17.4 GiB", "0 %", "27.2 samples/s").

rich wraps text at any whitespace, a no-break space included. So while a drawing is laid
out, the space between a number and its unit is a private-use character rich measures
as one cell and never breaks at (:func:`glue`), and every drawn line gets its space back
(:func:`unglue`) before it leaves the renderer."""

from __future__ import annotations

import copy
import re
from dataclasses import replace

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

UNITS = r"(?:[KMGT]iB|B|s|ms|%|samples/s|steps/s)(?![A-Za-z/])"
# a number, then its unit (HTML keeps the two in one no-wrap run by this pattern too)
NUMBER_AND_UNIT = re.compile(rf"(?<=\d) (?={UNITS})")
_JOINED = "\ue000"  # stands for the space while the layout is made


def glue(renderable: RenderableType) -> RenderableType:
    """``renderable`` with each number's space to its unit unbreakable: text, strings,
    and a table's title, headers and cells; other renderables as they are."""
    if isinstance(renderable, str):
        return NUMBER_AND_UNIT.sub(_JOINED, renderable)
    if isinstance(renderable, Text):
        joined = NUMBER_AND_UNIT.sub(_JOINED, renderable.plain)
        if joined == renderable.plain:
            return renderable
        text = renderable.copy()
        text.plain = joined  # one character for one: the styles keep their places
        return text
    if isinstance(renderable, Table):
        table = copy.copy(renderable)
        title = renderable.title
        table.title = NUMBER_AND_UNIT.sub(_JOINED, title) if isinstance(title, str) else title
        table.columns = [
            replace(c, header=glue(c.header), _cells=[glue(cell) for cell in c.cells])
            for c in renderable.columns
        ]
        return table
    return renderable


def unglue(drawn: str) -> str:
    """A drawn line with its spaces back."""
    return drawn.replace(_JOINED, " ")
