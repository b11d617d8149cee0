"""An HTML table that gives way at a narrow output as its text drawing does.

The text drawing knows its width and hides a table's least important columns to fit
(``base.hide_widths``). The browser alone knows the width of the output, and it changes
(a side panel opened, a window resized): each table sits in a block of its own that is a
CSS size container, with a rule per hideable column, ``@container (max-width: …ch)``,
at the width the text drawing hides it, and a line naming the hidden columns shown in
the same ranges. ``ch`` is measured in the table's monospace font, so a width in
characters means the same in both drawings. The block scrolls sideways on its own, its
scrollbar right under its table, when the key columns alone are wider.

A front end that strips ``<style>`` (an untrusted notebook) shows every column, the
block scrolling."""

from __future__ import annotations

import hashlib
import html
from collections.abc import Sequence

_BLOCK = (
    '<div class="torchmagic-table-block {scope}" style="overflow-x:auto !important;'
    'max-width:100%;container-type:inline-size;{font}">{style}{body}{notes}</div>'
)
_NOTE = (
    '<div class="{scope}-n{k}" style="display:none;white-space:normal;opacity:.7">'
    "… hidden at this width: {names}</div>"
)


def column_class(scope: str, column: int) -> str:
    return f"{scope}-c{column}"


def scope_of(body: str) -> str:
    """A class naming one table's rules: from its content, so that the same output
    drawn twice (another cell, a kernel restarted) shares rules that say the same."""
    return "tm-" + hashlib.sha1(body.encode()).hexdigest()[:10]


def block(
    scope: str, body: str, widths: Sequence[tuple[int, int]], names: Sequence[str], font: str
) -> str:
    """``body`` (a title and its table, hideable cells classed by ``column_class``) in
    its own scrolling container; ``widths``: (width, column) as ``base.hide_widths``
    gives them, ``names``: every column's header."""
    rules, notes = [], []
    for k, (below, column) in enumerate(widths):
        query = f"@container (max-width:{below - 1}ch)"
        hide = f".{scope} .{column_class(scope, column)}{{display:none}}"
        # !important: a note's own display:none is inline (no <style>, no note), and an
        # inline declaration beats a rule that is not important
        note = f".{scope} .{scope}-n{k}{{display:block !important}}"
        earlier = f".{scope} .{scope}-n{k - 1}{{display:none !important}}" if k else ""
        rules.append(f"{query}{{{hide}{note}{earlier}}}")
        gone = sorted(c for _, c in widths[: k + 1])  # named in table order, as in text
        hidden = ", ".join(html.escape(names[c], quote=False) for c in gone)
        notes.append(_NOTE.format(scope=scope, k=k, names=hidden))
    style = f"<style>{''.join(rules)}</style>" if rules else ""
    return _BLOCK.format(scope=scope, style=style, body=body, notes="".join(notes), font=font)
