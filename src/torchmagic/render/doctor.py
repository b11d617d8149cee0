"""Renderable for ``%tm doctor``: findings by severity, each with its fix.

The fix is the point of a finding, so it is never cut off: where the width leaves the
problem and its fix fewer than ``_ROOM`` columns beside severity / check / where, each
finding is a line of those three with its problem and fix below it. In HTML the width is
the browser's: each finding is a flex row whose problem and fix move below the other
three when the output is too narrow for both side by side."""

from __future__ import annotations

import html

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.padding import Padding
from rich.text import Text

from ..core.diagnostics.doctor import DoctorReport, Finding
from . import theme
from .base import FONT, RULE, HouseTable, OwnHtml, Rendered, html_text, human_bytes, table
from .spelling import fix_text

_STYLE = {
    "error": theme.style("error", bold=True),
    "warning": theme.style("warning"),
    "info": theme.style("info"),
}
_ROOM = 40  # the fewest columns the problem and its fix get beside the other three
_HEADS = ("", "check", "where", "problem → fix")


def doctor(report: DoctorReport, width: int | None = None) -> Rendered:
    scanned = "scanned: " + (", ".join(report.scanned) or "nothing (no models or optimizers)")
    if not report.findings:
        return Rendered(
            Group(Text("no problems found", style=theme.style("ok", bold=True)), Text(scanned)),
            width,
        )
    counts = {s: sum(f.severity == s for f in report.findings) for s in _STYLE}
    head = Text("doctor: ", style="bold")
    head.append(
        ", ".join(f"{n} {s}{'s' if n > 1 else ''}" for s, n in counts.items() if n),
        style="bold",
    )
    findings = Findings(report.findings)
    return Rendered(Group(head, findings, Text(scanned, style=theme.style("dim"))), width)


def _problem(finding: Finding) -> tuple[str, str]:
    """The problem (with the bytes it costs) and the fix, as drawn."""
    problem = finding.message
    if finding.nbytes:
        problem += f" ({human_bytes(finding.nbytes)})"
    return problem, fix_text(finding.advice)


class Findings(OwnHtml):
    """The findings: a table where the problem and fix fit beside the rest, else one
    finding per block (severity · check · where, then the problem, then the fix)."""

    def __init__(self, findings: tuple[Finding, ...]) -> None:
        self.findings = findings

    def _keys(self) -> list[tuple[str, str, str]]:
        return [(f.severity, f.check, f.subject) for f in self.findings]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        keys = self._keys()
        beside = sum(max(len(k[i]) for k in keys) for i in range(3)) + 9  # 3 rules of " │ "
        if options.max_width - beside >= _ROOM:
            yield self._table()
            return
        for finding in self.findings:
            line = Text(finding.severity, style=_STYLE[finding.severity])
            line.append(f" · {finding.check} · {finding.subject}")
            problem, fix = _problem(finding)
            below = Text(problem)
            below.append("\n→ ")
            below.append(fix, style=theme.style("ok"))
            yield line
            yield Padding(below, (0, 0, 0, 2))

    def _table(self) -> HouseTable:
        drawn = table(
            None,
            [(name, "left") for name in _HEADS],
            whole=(0, "check", "where"),
            show_lines=True,
        )
        for finding in self.findings:
            problem, fix = _problem(finding)
            cell = Text(problem + "\n→ ")
            cell.append(fix, style=theme.style("ok"))
            drawn.add_row(
                Text(finding.severity, style=_STYLE[finding.severity]),
                finding.check,
                finding.subject,
                cell,
            )
        return drawn

    def html(self) -> str:
        """A row per finding: severity, check and where in columns as wide as their
        widest entry, the problem and fix beside them, or below them where the output
        is narrower than both (flex-wrap: no script, no style sheet)."""
        keys = self._keys()
        widths = [max(len(k[i]) for k in [*keys, _HEADS[:3]]) for i in range(3)]

        def row(cells: tuple[str, str, str], right: str, rule: str, bold: bool) -> str:
            left = "".join(
                f'<span style="display:inline-block;min-width:{w}ch;margin-right:1ch;'
                f'white-space:pre">{cell}</span>'
                for cell, w in zip(cells, widths, strict=True)
            )
            weight = "font-weight:bold;" if bold else ""
            return (
                f'<div style="display:flex;flex-wrap:wrap;column-gap:1ch;{weight}'
                f'border-top:{rule};padding:1px 0">'
                f'<div style="flex:0 0 auto;white-space:normal">{left}</div>'
                f'<div style="flex:1 1 {_ROOM}ch;min-width:0;white-space:normal">'
                f"{right}</div></div>"
            )

        heads = tuple(html.escape(h) for h in _HEADS)
        rows = [row((heads[0], heads[1], heads[2]), heads[3], "none", True)]
        for finding in self.findings:
            severity = html_text(Text(finding.severity, style=_STYLE[finding.severity]))
            problem, fix = _problem(finding)
            right = (
                f"{html_text(Text(problem))}<br>→ {html_text(Text(fix, style=theme.style('ok')))}"
            )
            cells = (severity, html.escape(finding.check), html.escape(finding.subject))
            rows.append(row(cells, right, RULE, False))
        return f'<div class="torchmagic-findings" style="{FONT}">{"".join(rows)}</div>'
