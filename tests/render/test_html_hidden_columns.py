"""At a narrow output the HTML hides a table's least important columns where
its text drawing does, names them, and scrolls each table in a block of its own.

The browser applies the rules; here they are evaluated as it would (each
``@container (max-width: Nch)`` applies at widths up to N, later rules win) and
compared with what the text drawing shows at the same width in characters."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from rich.console import Group

from torchmagic import render
from torchmagic.core.training.fit_events import EpochMetrics
from torchmagic.render.training import epoch_table

GROUPS = ("bert.embeddings · no_decay", "bert.encoder.layer.1 · decay", "classifier")
QUERY = re.compile(r"@container \(max-width:(\d+)ch\)\{((?:[^{}]+\{[^{}]*\})*)\}")
RULE = re.compile(r"\.\S+ \.(\S+)\{display:(none|block)( !important)?\}")
NOTE = re.compile(r"-n\d+$")  # a note's class; its markup says display:none inline


def _table() -> render.Rendered:
    metrics = EpochMetrics(1, 0.6931, 0.7, 0.6, 4096, 12.5, (9.29e-6, 1e-3, 2e-5), GROUPS)
    return render.Rendered(epoch_table([metrics]), 100)


class _Cells(HTMLParser):
    """Each <th>'s class and text, each classed <div>'s class and text, the <style>."""

    def __init__(self) -> None:
        super().__init__()
        self.heads: list[tuple[str, str, bool]] = []  # (class, text, data-tm-key)
        self.notes: list[tuple[str, str]] = []
        self.blocks: list[str] = []
        self.style = ""
        self._open: tuple[str, dict] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and "torchmagic-table-block" in (attrs.get("class") or ""):
            self.blocks.append(attrs.get("style") or "")
        self._open = (tag, attrs)

    def handle_data(self, data):
        if self._open is None:
            return
        tag, attrs = self._open
        if tag == "th":
            self.heads.append((attrs.get("class") or "", data, "data-tm-key" in attrs))
        elif tag == "style":
            self.style += data
        elif tag == "div" and "-n" in (attrs.get("class") or ""):
            self.notes.append((attrs["class"], data))

    def handle_endtag(self, tag):
        self._open = None


def _shown_at(style: str, width: int) -> dict[str, str]:
    """class → display at a container ``width`` characters wide ("" where no rule). A
    note's inline ``display:none`` beats every rule that is not ``!important``."""
    display: dict[str, str] = {}
    for limit, body in QUERY.findall(style):
        if width <= int(limit):
            for cls, value, important in RULE.findall(body):
                if important or not NOTE.search(cls):
                    display[cls] = value
    return display


def _text_headers(drawn: render.Rendered, width: int) -> tuple[list[str], str]:
    """The headers the text drawing shows at ``width``, and its hidden-columns line."""
    at = render.Rendered(drawn.renderable, width)
    console = at.console()
    table, _ = at.drawn(console)[0]
    text = str(at)
    note = text[text.index("… hidden") :] if "… hidden" in text else ""
    return [str(c.header) for c in table.columns], " ".join(note.split())


def test_the_html_hides_the_columns_the_text_hides_at_each_width() -> None:
    drawn = _table()
    cells = _Cells()
    cells.feed(drawn.html())
    all_heads = [text for _, text, _ in cells.heads]
    assert len(all_heads) == 9  # every column is in the markup
    seen_hidden = set()
    for width in range(40, 181):
        display = _shown_at(cells.style, width)
        shown = [text for cls, text, _ in cells.heads if display.get(cls) != "none"]
        text_shown, text_note = _text_headers(drawn, width)
        assert shown == text_shown, width
        notes = [text for cls, text in cells.notes if display.get(cls) == "block"]
        gone = [h for h in all_heads if h not in shown]
        if gone:
            (note,) = notes
            assert note == "… hidden at this width: " + ", ".join(gone)
            assert text_note.endswith(", ".join(gone))  # the same names, the same order
            seen_hidden.add(len(gone))
        else:
            assert not notes and not text_note
    assert seen_hidden == {1, 2, 3, 4}  # each step seen, the key columns never hidden


def test_key_columns_carry_no_rule_and_each_table_scrolls_in_its_own_block() -> None:
    drawn = _table()
    cells = _Cells()
    cells.feed(render.Rendered(Group(drawn.renderable, drawn.renderable), 60).html())
    keys = [text for cls, text, key in cells.heads if key]
    assert keys[:5] == ["epoch", "train loss", "val loss", "val acc", keys[4]]
    assert all(not cls for cls, _, key in cells.heads if key)
    assert len(cells.blocks) == 2  # one scrolling block per table, right under it
    for style in cells.blocks:
        assert "overflow-x:auto" in style and "container-type:inline-size" in style
        assert "monospace" in style  # ch in the container's font is the table's character


def test_a_table_that_hides_nothing_has_no_rules() -> None:
    table = render.base.table("t", [("name", "left"), ("n", "right")])
    table.add_row("a", "1")
    html = render.Rendered(table, 80).html()
    assert "<style>" not in html and "torchmagic-table-block" in html
