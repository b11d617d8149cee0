"""Renderables for ``%gpumem``: the breakdown, the estimate, resets and the per-cell line."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..core.devices.batch_size import PHASES, PROBES, BatchSizeReport
from ..core.devices.estimate import Estimate, StepPeak
from ..core.devices.memory import CellMemory, MemoryReport, ResetReport
from . import theme
from .base import Rendered, human, human_bytes, table


def _table(title: str) -> Table:
    return table(title, [("", "left"), ("bytes", "right"), ("", "left")], whole=(0, 1))


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + human_bytes(abs(n))


def _lora_saving(state: int | None, full: int | None) -> Text | None:
    """The optimizer state LoRA holds against what full fine-tuning would."""
    if full is None or state is None:
        return None
    ratio = f" ({full / state:.0f}x less)" if state else ""
    return Text(
        f"LoRA: optimizer state {human_bytes(state)}; full fine-tuning would hold "
        f"{human_bytes(full)}{ratio}",
        style=theme.style("ok"),
    )


def memory(report: MemoryReport, width: int | None = None) -> Rendered:
    whose = f" of `{report.model_name}`" if report.model_name else ""
    drawn = _table(f"memory on {report.device}{whose}")
    rows = (
        ("parameters, trainable", report.params_trainable, ""),
        ("parameters, frozen", report.params_frozen, "no gradient, no optimizer state"),
        ("buffers", report.buffers, "BatchNorm statistics …"),
        ("gradients", report.grads, ""),
        ("optimizer state", report.optimizer_state, ""),
    )
    for label, n, note in rows:
        drawn.add_row(label, human_bytes(n), Text(note, style=theme.style("dim")))
    drawn.add_row(Text("tensors counted", style="bold"), human_bytes(report.tensors), "")
    if report.rest is not None:
        rest = (
            "activations, allocator cache and other tensors"
            if report.source == "cuda allocator"
            else "interpreter, libraries, activations and other tensors"
        )
        drawn.add_row("rest", human_bytes(report.rest), Text(rest, style=theme.style("dim")))
    parts: list[RenderableType] = [drawn]
    totals = []
    if report.in_use is not None:
        label = "allocated" if report.source == "cuda allocator" else "process RSS"
        totals.append(f"{label} {human_bytes(report.in_use)}")
    if report.reserved is not None:
        totals.append(f"reserved {human_bytes(report.reserved)}")
    if report.peak is not None:
        totals.append(f"peak {human_bytes(report.peak)}")
    if report.free is not None and report.total is not None:
        totals.append(f"free {human_bytes(report.free)} of {human_bytes(report.total)}")
    if totals:
        parts.append(Text(" · ".join(totals) + f"  ({report.source})"))
    saving = _lora_saving(report.optimizer_state, report.full_finetune_state)
    if saving is not None:
        parts.append(saving)
    if report.elsewhere:
        parts.append(
            Text(f"{human_bytes(report.elsewhere)} of these tensors live on other devices")
        )
    if report.history_bytes:
        parts.append(
            Text(
                f"the undo history holds {human_bytes(report.history_bytes)} on the host "
                "(optimizer state and layers set aside): %tm clear releases it",
                style=theme.style("dim"),
            )
        )
    if report.traceback_frames:
        parts.append(
            Text(
                f"the last traceback holds {report.traceback_frames} frames referencing "
                f"{human_bytes(report.traceback_bytes)} of tensors: "
                "%gpumem reset --tracebacks drops them",
                style=theme.style("warning"),
            )
        )
    return Rendered(Group(*parts), width)


def _peak_rows(drawn: Table, peak: StepPeak) -> None:
    """The predicted peak of a whole step: each phase's high-water mark, the highest bold."""
    dim = theme.style("dim")
    notes = {
        "forward": "input and saved activations, with the forward's temporaries",
        "backward": "saved activations, activation gradients and parameter gradients",
        "optimizer step": f"gradients and the step's temporaries ({peak.optimizer_impl})",
    }
    extra = []
    if peak.autocast_copies:
        extra.append(f"autocast copies {human_bytes(peak.autocast_copies)}")
    if peak.workspace:
        extra.append(f"workspace {human_bytes(peak.workspace)}")
    for phase, size in peak.phases.items():
        bold = "bold" if phase == peak.phase else ""
        drawn.add_row(
            Text(f"peak in {phase}", style=bold),
            Text(human_bytes(size), style=bold),
            Text(
                notes[phase]
                + (f"; {', '.join(extra)}" if extra and phase != "optimizer step" else ""),
                style=dim,
            ),
        )


def estimate(est: Estimate, width: int | None = None) -> Rendered:
    opt = f" with {est.optimizer}" if est.optimizer else ""
    drawn = _table(f"estimate for one training step of `{est.model_name}`{opt}")
    drawn.add_row("weights", human_bytes(est.weights), "")
    drawn.add_row("buffers", human_bytes(est.buffers), "")
    drawn.add_row(
        "gradients",
        human_bytes(est.grads),
        Text(f"{human(est.trainable)} trainable parameters", style=theme.style("dim")),
    )
    state = "unknown" if est.optimizer_state is None else human_bytes(est.optimizer_state)
    drawn.add_row("optimizer state", state, Text(est.state_rule, style=theme.style("dim")))
    if est.idle_state:
        drawn.add_row(
            "  of which idle",
            human_bytes(est.idle_state),
            Text("held by parameters a step skips (frozen, still in the optimizer)"),
        )
    if est.activations is not None:
        shape = "×".join(map(str, est.input_shape or ()))
        drawn.add_row(
            "activations",
            human_bytes(est.activations),
            Text(
                f"saved for backward, input {shape} (the forward's peak is higher)",
                style=theme.style("dim"),
            ),
        )
    drawn.add_row(
        Text("persistent", style="bold"),
        Text(human_bytes(est.persistent), style="bold"),
        Text("weights, buffers, gradients and state, held between steps", style=theme.style("dim")),
    )
    if est.peak is not None:
        _peak_rows(drawn, est.peak)
    parts: list[RenderableType] = [drawn]
    saving = _lora_saving(est.optimizer_state, est.full_finetune_state)
    if saving is not None:
        parts.append(saving)
    if est.frozen and est.freeze_saving is not None:
        parts.append(
            Text(
                f"frozen: {human(est.frozen)} parameters; freezing them saves "
                f"{human_bytes(est.freeze_saving)} of gradients and optimizer state",
                style=theme.style("ok"),
            )
        )
    return Rendered(Group(*parts), width)


def reset(report: ResetReport, width: int | None = None) -> Rendered:
    peaks = ", ".join(report.peaks) if report.peaks else "none (not supported here)"
    parts: list[RenderableType] = [Text(f"peak counters reset: {peaks}")]
    if report.frames_dropped:
        parts.append(
            Text(
                f"dropped the last traceback: {report.frames_dropped} frames, "
                f"{human_bytes(report.released_bytes)} of tensors released"
            )
        )
    return Rendered(Group(*parts), width)


def cell_line(cell: CellMemory) -> str:
    """The one line ``%gpumem watch on`` prints after each cell (plain text: it follows
    the cell's own output)."""
    peak = "" if cell.peak is None else f", peak {human_bytes(cell.peak)}"
    return f"[{cell.device}] {_signed(cell.delta)} (now {human_bytes(cell.after)}{peak})"


def batch_size(report: BatchSizeReport, width: int | None = None) -> Rendered:
    """The largest batch that fits, the measured points and the line through them."""
    if report.batch:
        why = "max_batch" if report.capped else "memory"
        head = Text(f"largest batch on {report.device}: {report.batch}", style=theme.style("ok"))
        head.append(f"  (limited by {why}; found in {report.seconds:.1f} s)", theme.style("dim"))
    elif report.points and not report.phase:
        head = Text(
            f"the step's memory does not grow with the batch on {report.device}: memory sets "
            "no limit (give a largest batch to consider)",
            style=theme.style("warning"),
        )
    elif not report.points:
        head = Text(
            f"not even a batch of {PROBES[0]} fits on {report.device}", style=theme.style("error")
        )
    else:
        head = Text(
            f"not even a batch of 1 fits on {report.device}: the {report.phase} needs more "
            f"than the {human_bytes(report.capacity)} of room",
            style=theme.style("error"),
        )
    how = "meta-device replica" if report.device == "cpu" else "measured"
    drawn = _table(f"training steps ({how}), peak of each phase")
    for point in report.points:
        drawn.add_row(
            f"batch {point.batch}",
            human_bytes(point.step_bytes),
            Text(
                " · ".join(
                    f"{name.split()[-1]} {human_bytes(n)}"
                    for name, n in zip(PHASES, point.phases, strict=True)
                ),
                style=theme.style("dim"),
            ),
        )
    drawn.add_row(
        f"fitted line, {report.phase}" if report.phase else "fitted line",
        human_bytes(report.per_sample_bytes),
        Text(
            f"per sample, on top of {human_bytes(report.fixed_bytes)}; room for the step: "
            f"{human_bytes(report.capacity)}",
            style=theme.style("dim"),
        ),
    )
    if report.confirmed_bytes is not None:
        drawn.add_row(
            f"batch {report.batch}",
            human_bytes(report.confirmed_bytes),
            Text(
                "confirmed"
                + (
                    f" after {report.backoffs} back-off{'s' if report.backoffs != 1 else ''}"
                    if report.backoffs
                    else ""
                ),
                style=theme.style("dim"),
            ),
        )
    return Rendered(Group(head, drawn, *_accumulation(report)), width)


def _accumulation(report: BatchSizeReport) -> list[Text]:
    """How gradient accumulation reaches the effective batch asked for (none asked: nothing)."""
    if report.effective_batch is None:
        return []
    if report.accumulation is None:
        return [Text(f"effective batch {report.effective_batch}: no batch fits to accumulate")]
    accumulate, micro = report.accumulation
    if accumulate == 1:
        how = f"one batch of {report.effective_batch} fits: no accumulation needed"
    else:
        how = (
            f"--accum {accumulate} with batches of {micro} "
            f"({accumulate * micro} samples per optimizer step)"
        )
    return [Text(f"effective batch {report.effective_batch}: {how}", style=theme.style("info"))]
