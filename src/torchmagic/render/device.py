"""Renderables for ``%device``: the device list, a move, misplaced tensors, pinbench."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..core.devices.device import DeviceReport, MoveReport
from ..core.devices.pinbench import PinReport
from ..core.devices.placement import CheckReport, Misplaced
from . import theme
from .base import Rendered, human_bytes, table
from .spelling import fix_text


def _bytes(n: int | None) -> str:
    return "" if n is None else human_bytes(n)


def _yes_no(flag: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[flag]


def devices(report: DeviceReport, width: int | None = None) -> Rendered:
    drawn = table(
        "devices",
        (
            ("", "left"),
            ("device", "left"),
            ("name", "left"),
            ("capability", "left"),
            ("free", "right"),
            ("total", "right"),
            ("bf16", "left"),
            ("details", "left"),
        ),
        whole=("device", "name", "free", "total", "bf16"),
        # a long name ("Intel(R) Xeon(R) Processor") last: free and total stay in view
        hide=("details", "capability", "bf16", "name"),
    )
    for d in report.devices:
        drawn.add_row(
            Text("●", style=theme.style("ok", bold=True)) if d.current else "",
            Text(d.name, style="bold" if d.current else ""),
            d.description,
            d.capability,
            _bytes(d.free_bytes),
            _bytes(d.total_bytes),
            _yes_no(d.bf16),
            Text(d.detail, style=theme.style("dim")),
        )
    parts: list[RenderableType] = [drawn, Text(f"session device: {report.current}")]
    parts += [Text(note, style=theme.style("dim")) for note in report.notes]
    return Rendered(Group(*parts), width)


def _misplaced_table(items: tuple[Misplaced, ...], title: str | None) -> Table:
    drawn = table(
        title,
        (
            ("tensor", "left"),
            ("kind", "left"),
            ("device", "left"),
            ("shape", "left"),
            ("size", "right"),
            ("fix", "left"),
        ),
        whole=("tensor", "kind", "device", "shape", "size"),
        hide=("shape", "size", "kind"),
    )
    for m in items:
        shape = "×".join(map(str, m.shape)) if m.shape else "scalar"
        drawn.add_row(
            m.name,
            m.kind,
            Text(m.device, style=theme.style("error")),
            shape,
            human_bytes(m.nbytes),
            fix_text(m.advice),
        )
    return drawn


def moved(report: MoveReport, width: int | None = None) -> Rendered:
    if not report.tensors:
        title = Text(f"`{report.model_name}` is already on {report.device}: nothing to move")
        if not report.left_behind:
            return Rendered(title, width)
        left = _misplaced_table(report.left_behind, "not on it (model.to cannot move these)")
        return Rendered(Group(title, left), width)
    title = Text()
    title.append(f"moved `{report.model_name}` to {report.device}", style="bold")
    title.append(f": {human_bytes(report.total_bytes)} in {report.tensors} tensors")
    detail = Text(
        f"parameters and buffers {human_bytes(report.model_bytes)} · gradients "
        f"{human_bytes(report.grad_bytes)} · optimizer state "
        f"{human_bytes(report.optimizer_bytes)} · GradScaler {human_bytes(report.scaler_bytes)}"
        " · the optimizer keeps the same parameter objects"
    )
    parts: list[RenderableType] = [title, detail]
    if report.left_behind:
        parts.append(_misplaced_table(report.left_behind, "left behind (model.to cannot move)"))
    return Rendered(Group(*parts), width)


def misplaced(report: CheckReport, width: int | None = None) -> Rendered:
    if report.reference is None:
        return Rendered(
            Text(f"`{report.model_name}` has no tensors", style=theme.style("dim")), width
        )
    if not report.misplaced:
        return Rendered(
            Text(
                f"all {report.tensors} tensors of `{report.model_name}` are on {report.reference}",
                style=theme.style("ok"),
            ),
            width,
        )
    head = Text(
        f"{len(report.misplaced)} of {report.tensors} tensors are not on {report.reference}, "
        f"where `{report.model_name}`'s parameters are",
        style="bold",
    )
    return Rendered(Group(head, _misplaced_table(report.misplaced, None)), width)


def pin_report(report: PinReport, width: int | None = None) -> Rendered:
    if not report.ran:
        return Rendered(Text(report.reason), width)
    drawn = table(
        f"host → {report.device}: one batch, {human_bytes(report.batch_bytes)} in "
        f"{report.tensors} tensor(s), median of {report.repeats}",
        (("host memory", "left"), ("copy", "left"), ("ms", "right"), ("GB/s", "right")),
        whole=("host memory", "copy", "ms", "GB/s"),
    )
    rows = (
        ("pageable", "blocking", report.pageable_ms),
        ("pageable", "non_blocking", report.pageable_non_blocking_ms),
        ("pinned", "blocking", report.pinned_ms),
        ("pinned", "non_blocking", report.pinned_non_blocking_ms),
    )
    for memory, copy, ms in rows:
        rate = report.batch_bytes / ms / 1e6 if ms else 0.0
        drawn.add_row(memory, copy, f"{ms:.3f}", f"{rate:.1f}")
    drawn.add_row("(pin_memory() itself)", "", f"{report.pin_ms:.3f}", "")
    advice = Text(report.advice, style=theme.style("ok", bold=True) if report.recommend else "")
    parts: list[RenderableType] = [drawn, advice]
    if report.loader_pins is not None:
        parts.append(
            Text(f"the loader has pin_memory={report.loader_pins}", style=theme.style("dim"))
        )
    return Rendered(Group(*parts), width)
