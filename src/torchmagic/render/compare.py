"""Renderable for ``device compare``: step time per device and the verdict."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ..core.devices.compare import CompareReport
from . import theme
from .base import Rendered, human_bytes, table


def device_compare(report: CompareReport, width: int | None = None) -> Rendered:
    fastest = report.fastest
    rows: list[tuple[Text | str, ...]] = []
    for t in report.timings:
        if not t.timed:
            rows.append(
                (t.device, "", "", "", Text(f"skipped: {t.skipped}", style=theme.style("dim")))
            )
            continue
        best = t.device == fastest and report.runner_up
        rows.append(
            (
                Text(t.device, style=theme.style("ok", bold=True) if best else ""),
                f"{t.step_ms:.2f}",
                f"{t.copy_ms:.2f}",
                f"{t.samples_per_s:,.0f}",
                Text("fastest", style=theme.style("ok")) if best else "",
            )
        )
    # the notes column ("fastest", "skipped: …") only where a row has a note
    noted = any(str(row[-1]) for row in rows)
    drawn = table(
        f"`{report.model_name}` on one batch of {report.batch_size} "
        f"({human_bytes(report.batch_bytes)})",
        (
            ("device", "left"),
            ("step ms", "right"),
            ("of which copy", "right"),
            ("samples/s", "right"),
            *((("", "left"),) if noted else ()),
        ),
        whole=("device",),
        hide=("of which copy", "samples/s"),
    )
    for row in rows:
        drawn.add_row(*(row if noted else row[:-1]))
    parts: list[RenderableType] = [drawn]
    if report.runner_up:
        parts.append(
            Text(
                f"{fastest} is {report.speedup:.1f}x faster than {report.runner_up} for "
                "this model and batch (host→device copy included)",
                style="bold",
            )
        )
    if report.cpu_only:
        parts.append(Text(f"CPU only: {report.no_accelerator}", style="bold"))
    parts.append(
        Text(
            "timed on copies: the model, its optimizer and the random state are unchanged",
            style=theme.style("dim"),
        )
    )
    return Rendered(Group(*parts), width)
