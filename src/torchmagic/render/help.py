"""``%tm help``: every magic on one screen (a line each: the magic, what it is for, its
link into the reference), and one magic's full usage (``%tm help fit``), both read from
the manifest."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Group, JustifyMethod
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ..manifest import help_text, reference_lines
from . import theme
from .base import Rendered, table

_CODE = re.compile(r"`([^`]+)`")  # may span a line break


@dataclass(frozen=True)
class ManifestHelp:
    """The extension's manifest (``manifest.load_manifest()``), shown as the help screen."""

    manifest: Mapping


@dataclass(frozen=True)
class MagicHelp:
    """One magic's manifest entry: its help text is laid out at the output's width."""

    entry: Mapping


def code_text(text: str, style: Style | str = "") -> Text:
    """``text`` with its `backticked` words drawn as code (the accent colour), the
    backticks themselves left out."""
    drawn = Text(style=style)
    at = 0
    for found in _CODE.finditer(text):
        drawn.append(text[at : found.start()])
        drawn.append(found.group(1), style=theme.style("accent"))
        at = found.end()
    return drawn.append(text[at:])


def _magic(entry: Mapping) -> str:
    return f"{'%%' if entry['kind'] == 'cell' else '%'}{entry['name']}"


def manifest_help(manifest: Mapping, width: int | None = None) -> Rendered:
    """A line per magic; the usage of each is one ``%tm help NAME`` away. In HTML each
    magic's name links into the reference; the text a terminal shows has no anchors."""
    rendered = Rendered(Group(), width)
    title = Text(f"{manifest['name']} {manifest['version']}", style="bold")
    title.append(" · ", style=theme.style("dim"))
    title.append("%tm help MAGIC", style=theme.style("accent"))
    title.append(": one magic's usage", style=theme.style("dim"))
    columns: list[tuple[str, JustifyMethod]] = [("magic", "left"), ("what it is for", "left")]
    drawn = table(None, columns, (0, 2), show_header=False, box=None)
    for magic in manifest["magics"]:
        link = Style(link=magic["docs"])
        drawn.add_row(
            Text(_magic(magic), style=theme.style("accent", bold=True) + link),
            code_text(magic["purpose"]),
        )
    where = reference_lines(manifest["documentation"], rendered.width)
    rendered.renderable = Group(title, drawn, Text("\n".join(where), style=theme.style("dim")))
    return rendered


def _whole(line: Text) -> Table:
    """A line drawn whole where it is wider than the output (a word longer than the
    line): a one-cell table, which is laid out at its own width rather than cut."""
    drawn = table(None, [("line", "left")], (0,), show_header=False, box=None)
    drawn.add_row(line)
    return drawn


def magic_help(result: MagicHelp, width: int | None = None) -> Rendered:
    """The usage text as ``%name?`` shows it, wrapped once at the output's width (drawn
    as it is, never wrapped again), its first lines bold, `code` drawn as code."""
    rendered = Rendered(Group(), width)
    usage, _, rest = help_text(dict(result.entry), rendered.width).partition("\n\n")
    body = code_text(rest)  # across lines: a `code span` may wrap
    body.highlight_regex(re.compile(r"^[a-z]+:$", re.M), theme.style("dim"))
    parts: list[Text | Table] = [Text(usage, style="bold"), Text("")]
    lines: list[Text] = []
    for line in body.split("\n"):
        if len(line.plain) <= rendered.width:
            lines.append(line)
            continue
        parts += [Text("\n").join(lines), _whole(line)] if lines else [_whole(line)]
        lines = []
    rendered.renderable = Group(*parts, *([Text("\n").join(lines)] if lines else []))
    return rendered
