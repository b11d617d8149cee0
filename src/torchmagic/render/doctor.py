"""Renderable for ``%tm doctor``: findings by severity, each with its fix."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from ..core.diagnostics.doctor import DoctorReport
from . import theme
from .base import Rendered, human_bytes, table
from .spelling import fix_text

_STYLE = {
    "error": theme.style("error", bold=True),
    "warning": theme.style("warning"),
    "info": theme.style("info"),
}


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
    drawn = table(
        None,
        [("", "left"), ("check", "left"), ("where", "left"), ("problem → fix", "left")],
        whole=(0, "check", "where"),
        show_lines=True,
    )
    for f in report.findings:
        problem = Text(f.message)
        if f.nbytes:
            problem.append(f" ({human_bytes(f.nbytes)})")
        problem.append("\n→ ")
        problem.append(fix_text(f.advice), style=theme.style("ok"))
        drawn.add_row(Text(f.severity, style=_STYLE[f.severity]), f.check, f.subject, problem)
    return Rendered(Group(head, drawn, Text(scanned, style=theme.style("dim"))), width)
