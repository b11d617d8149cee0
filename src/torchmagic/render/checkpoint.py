"""Renderables for leaving the kernel: what a save wrote, what a resume replayed and
loaded, what an export wrote."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ..core.advice import Command
from ..core.checkpoint import ResumeReport, SaveReport
from ..core.export import ExportReport
from . import theme
from .base import Rendered, human_bytes
from .spelling import fix_text


def _commands(commands: tuple[Command, ...]) -> list[RenderableType]:
    if not commands:
        return [
            Text("no commands: the model's structure is as it was built", style=theme.style("dim"))
        ]
    return [Text(f"  {i}. {fix_text(c)}") for i, c in enumerate(commands, start=1)]


def _what(optimizer: str | None, groups: int, schedulers: tuple[str, ...], amp: str | None) -> Text:
    plural = "" if groups == 1 else "s"
    parts = [
        f"optimizer `{optimizer}` ({groups} param group{plural})" if optimizer else "no optimizer"
    ]
    parts.append(f"schedulers: {', '.join(schedulers)}" if schedulers else "no scheduler")
    parts.append(f"AMP {amp}" if amp else "AMP off")
    return Text(" · ".join(parts))


def saved(report: SaveReport, width: int | None = None) -> Rendered:
    title = Text()
    title.append(f"saved `{report.model_name}` ({report.model_class})", style="bold")
    title.append(f" to {report.path} ({human_bytes(report.nbytes)}")
    title.append(", synced to disk)" if report.synced else ")")
    parts: list[RenderableType] = [
        title,
        _what(report.optimizer_name, report.groups, report.schedulers, report.amp),
        Text(f"structure: {len(report.commands)} command(s), replayed by a resume:"),
        *_commands(report.commands),
        Text(
            "continue elsewhere: torchmagic.resume(PATH, model, optimizer, schedulers)",
            style=theme.style("dim"),
        ),
    ]
    return Rendered(Group(*parts), width)


def resumed(report: ResumeReport, width: int | None = None) -> Rendered:
    title = Text()
    title.append(f"resumed `{report.model_name}` ({report.model_class})", style="bold")
    title.append(f" from {report.path} (saved by torchmagic {report.saved_with})")
    parts: list[RenderableType] = [
        title,
        _what(report.optimizer_name, report.groups, report.schedulers, report.amp),
        Text(f"replayed {len(report.commands)} command(s) (in the history; not undoable):"),
        *_commands(report.commands),
        Text(
            "weights, optimizer state, scheduler, GradScaler and RNG states loaded by name",
            style=theme.style("ok"),
        ),
        *(Text(line, style=theme.style("warning")) for line in report.warnings),
    ]
    return Rendered(Group(*parts), width)


def exported(report: ExportReport, width: int | None = None) -> Rendered:
    title = Text()
    title.append(f"exported {report.commands} session call(s)", style="bold")
    title.append(f" to {report.path}")
    expects = ", ".join(f"{name} ({what})" for name, what in report.variables)
    return Rendered(Group(title, Text(f"it expects: {expects}")), width)
