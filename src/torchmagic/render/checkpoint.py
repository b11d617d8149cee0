"""Renderables for leaving the kernel: what a save wrote, what a resume replayed and
loaded, what an export wrote (a script, or the model for inference and how well the
file matched the live model)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ..core.advice import Command
from ..core.checkpoint import ResumeReport, SaveReport
from ..core.export import ExportReport, InferenceReport
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


def _shown(values: tuple[str, ...], most: int = 5) -> str:
    more = f", … ({len(values)} in all)" if len(values) > most else ""
    return ", ".join(values[:most]) + more


def exported_for_inference(report: InferenceReport, width: int | None = None) -> Rendered:
    title = Text()
    title.append(f"exported `{report.model_name}` for inference as {report.format}", style="bold")
    title.append(f" to {report.path} ({human_bytes(report.nbytes)})")
    probe = "×".join(map(str, report.probe_shape))
    if report.max_difference is None:
        check = Text(
            "read back and checked; outputs not compared (install onnxruntime for that)",
            style=theme.style("warning"),
        )
    else:
        check = Text(
            f"read back: outputs within {report.max_difference:.2g} of the live model's "
            f"on a {probe} batch (tolerance {report.tolerance:g})",
            style=theme.style("ok"),
        )
    made = ["BatchNorm in eval", "torchmagic's hooks removed"]
    if report.merged_adapters:
        made.insert(0, f"{report.merged_adapters} LoRA layer(s) merged (the live model keeps them)")
    labels = f"labels: {_shown(report.labels)}" if report.labels else "labels: not known"
    prep = report.preprocessing
    if prep is None:
        stored = "preprocessing: not known"
    else:
        parts = [
            f"resize {prep.resize_size}" if prep.resize_size else "",
            f"crop {prep.crop_size}" if prep.crop_size else "",
            f"mean {tuple(prep.mean)}" if prep.mean else "",
            f"std {tuple(prep.std)}" if prep.std else "",
        ]
        stored = "preprocessing: " + ", ".join(p for p in parts if p)
    return Rendered(
        Group(
            title,
            check,
            Text(" · ".join(made)),
            Text(f"stored in the file: {labels}; {stored}", style=theme.style("dim")),
        ),
        width,
    )
