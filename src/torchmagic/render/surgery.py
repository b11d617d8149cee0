"""Renderables for the surgery commands: changes, summaries and history."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Group, JustifyMethod, RenderableType
from rich.padding import Padding
from rich.text import Text

from ..core import Change, GroupInfo, HistoryEntry, SummaryReport
from ..core.advice import Command
from ..core.surgery.history import REBOUND, REPLAYED
from ..core.surgery.shapes import ModuleOutput
from . import theme
from .base import Facts, Rendered, human, human_bytes, lr, share, table
from .spelling import fix_text

_STATE_STYLE = {
    "trainable": theme.style("ok"),
    "frozen": theme.style("frozen"),
    "partial": theme.style("warning"),
}
_STATUS_STYLE = {"new": theme.style("ok", bold=True), "changed": theme.style("warning")}


def _names(modules: Sequence[str], shown: int = 6) -> str:
    """Module names for a title line, cut after ``shown`` so a glob cannot flood it."""
    if len(modules) <= shown:
        return ", ".join(modules)
    return ", ".join(modules[:shown]) + f" … and {len(modules) - shown} more"


def group_label(group: GroupInfo) -> str:
    """A group's name; an unnamed group (the engine labels it by its index) reads
    "group 0", so it is not mistaken for a Sequential child "0"."""
    return f"group {group.index}" if group.name == str(group.index) else group.name


def _group_lr(group: GroupInfo) -> str:
    """The lr now, with the base lr the schedule scales when it differs."""
    if group.lr is None:
        return "relative step"
    if group.base_lr is None or group.base_lr == group.lr:
        return lr(group.lr)
    return f"base {lr(group.base_lr)} · now {lr(group.lr)}"


def _schedulers(names: Sequence[str]) -> str:
    return " + ".join(names)


_GROUP_ROWS = 20  # an optimizer of 10,000 groups (a spread over 10,000 blocks) shows 20


def _bounded(groups: Sequence[GroupInfo]) -> tuple[list[GroupInfo | None], list[GroupInfo]]:
    """The groups to draw, None where the hidden middle goes, and the hidden ones: the
    first and last ``_GROUP_ROWS // 2`` of a long list, so a table stays readable."""
    if len(groups) <= _GROUP_ROWS + 1:
        return list(groups), []
    half = _GROUP_ROWS // 2
    return [*groups[:half], None, *groups[-half:]], list(groups[half:-half])


def _hidden_groups(hidden: Sequence[GroupInfo]) -> str:
    statuses = [g.status for g in hidden if g.status]
    counted = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    return f"{len(hidden)} more groups" + (f" ({counted})" if counted else "")


def _groups(groups: Sequence[GroupInfo], optimizer_name: str | None) -> list[RenderableType]:
    """The groups table, and which schedulers step the lrs: one line under it when every
    group shares them, else beside each group's lr."""
    shared = {g.schedulers for g in groups}
    per_group = len(shared) > 1
    drawn = table(
        f"optimizer `{optimizer_name}` param groups",
        [
            ("#", "right"),
            ("group", "left"),
            ("lr", "right"),
            ("params", "right"),
            ("wd", "right"),
            ("tensors", "right"),
        ],
        whole=("#", "group", "wd", "tensors", "params"),
        hide=("tensors", "wd", "params"),
    )
    shown, hidden = _bounded(groups)
    for g in shown:
        if g is None:
            drawn.add_row("…", _hidden_groups(hidden), "", "", "", "", "")
            continue
        rate = _group_lr(g)
        if per_group and g.schedulers:
            rate += f" ({_schedulers(g.schedulers)})"
        wd = "" if g.weight_decay is None else f"{g.weight_decay:g}"
        params = human(g.numel) if g.tensors else "(empty)"
        label = Text(group_label(g))
        if g.status:  # what the command did to it, beside its name
            label.append(f" ({g.status})", style=_STATUS_STYLE.get(g.status, ""))
        drawn.add_row(str(g.index), label, rate, params, wd, str(g.tensors))
    parts: list[RenderableType] = [drawn]
    if not per_group and groups[0].schedulers:
        parts.append(
            Text(f"lr schedule: {_schedulers(groups[0].schedulers)}", style=theme.style("dim"))
        )
    return parts


def _lr_range(given: Sequence[float | None]) -> str:
    lrs = [value for value in given if value is not None]
    if not lrs:
        return "relative step" if given else ""
    low, high = min(lrs), max(lrs)
    return lr(low) if low == high else f"{lr(low)}…{lr(high)}"


def _bn_text(modes: Mapping[str, int]) -> Text | None:
    if not modes:
        return None
    meaning = {
        "held": "held in eval: running stats frozen, also after model.train()",
        "frozen": "swapped for FrozenBatchNorm2d",
        "train": "training mode: running stats update",
        "eval": "eval mode",
    }
    parts = [f"{n} {meaning[m]}" for m, n in modes.items() if n]
    return Text("BatchNorm: " + "; ".join(parts), style=theme.style("bn"))


_VERBS = {
    "freeze": "froze",
    "unfreeze": "unfroze",
    "replace_head": "replaced head",
    "lora": "added LoRA adapters to",
    "merge_lora": "merged the LoRA adapters of",
    "lora_off": "switched off the LoRA adapters of",
    "lora_on": "switched on the LoRA adapters of",
}
# What a block the command left as it was already is: "already frozen".
_ALREADY = {"freeze": "frozen", "unfreeze": "trainable"}
# Parameters whose requires_grad was already right, set by hand, but whose optimizer was not.
_RESYNCED = {
    "freeze": "{} params frozen by hand (requires_grad=False) were still in `{}`: taken out",
    "unfreeze": "{} params trainable by hand were in no group of `{}`: added",
}
_NO_OPTIMIZER = {
    "replace_head": "no optimizer holds this model's parameters: create one for the new head",
}


def _scope(modules: Sequence[str]) -> str:
    """What the targets named, before ``--except``: "everything" for the whole model."""
    return "everything" if modules in ((), ("",)) else _names(modules)


def _title(change: Change) -> Text:
    effect = change.effect
    title = Text()
    if change.dry_run:
        title.append("dry run — nothing changed · ", style=theme.style("warning", bold=True))
    if change.action == "undo":
        title.append("undid: ", style="bold")
        undone = fix_text(change.command).removeprefix("undo ")
        title.append(undone, style=theme.style("accent", bold=True))
        title.append(f"  ({human(effect.params)} params) in `{change.model_name}`")
        return title
    changed = [m for m in effect.modules if m not in effect.already]
    flipped_none = effect.params == 0 and effect.resynced  # only optimizer membership changed
    if change.action in _ALREADY and (flipped_none or not (changed or effect.excluded)):
        # e.g. an unfreeze with lr= of blocks that trained already: only groups changed
        title.append(_scope(effect.modules), style=theme.style("accent", bold=True))
        if effect.excluded:
            title.append(f" except {_names(effect.excluded)}", style="bold")
        title.append(f" already {_ALREADY[change.action]}", style="bold")
        return title.append(f" in `{change.model_name}`")
    if effect.excluded:
        title.append(f"{_VERBS.get(change.action, change.action)} ", style="bold")
        title.append(_scope(effect.modules), style=theme.style("accent", bold=True))
        title.append(" except ", style="bold")
        title.append(_names(effect.excluded), style=theme.style("accent", bold=True))
    else:
        title.append(f"{_VERBS.get(change.action, change.action)} ", style="bold")
        title.append(_names(changed or effect.modules), style=theme.style("accent", bold=True))
    title.append(f"  ({human(effect.params)} params) in `{change.model_name}`")
    return title


def _unchanged(change: Change) -> Text:
    """The one line of a command that found everything as it would leave it."""
    line = Text("nothing changed: ", style=theme.style("dim"))
    state = _ALREADY.get(change.action)
    if state is None:
        return line.append(fix_text(change.command))
    line.append(_scope(change.effect.modules), style=theme.style("accent"))
    if change.effect.excluded:
        line.append(f" except {_names(change.effect.excluded)}")
    return line.append(f" already {state} in `{change.model_name}`")


def change(change: Change, width: int | None = None) -> Rendered:
    if change.unchanged:
        return Rendered(_unchanged(change), width)
    effect = change.effect
    before, after = change.before, change.after
    counts = Text(
        f"trainable {human(before.trainable)} → {human(after.trainable)} "
        f"({share(after.trainable_pct)} of {human(after.total)}) · frozen {human(after.frozen)}"
    )
    parts: list[RenderableType] = [_title(change), counts]
    already = [m for m in effect.modules if m in effect.already]
    if already and change.action in _ALREADY and len(already) < len(effect.modules):
        parts.append(
            Text(f"already {_ALREADY[change.action]}: {_names(already)}", style=theme.style("dim"))
        )
    if effect.state_freed_bytes:
        parts.append(
            Text(
                f"optimizer state moved off the accelerator: "
                f"{human_bytes(effect.state_freed_bytes)}"
            )
        )
    if effect.resynced and change.action in _RESYNCED:
        parts.append(
            Text(_RESYNCED[change.action].format(human(effect.resynced), change.optimizer_name))
        )
    bn = _bn_text(effect.bn_modes)
    if bn is not None:
        parts.append(bn)
    for note in effect.notes:
        parts.append(Text(fix_text(note), style=theme.style("dim")))
    if change.groups:
        parts += _groups(change.groups, change.optimizer_name)
    elif change.optimizer_name is None:
        missing = _NO_OPTIMIZER.get(
            change.action, "no optimizer holds this model's parameters: only requires_grad changed"
        )
        parts.append(Text(missing, style=theme.style("dim")))
    return Rendered(Group(*parts), width)


def _group_cell(labels: Sequence[str]) -> str:
    """The groups of one module's parameters: named while two fit, else counted (the
    groups table below names them all, and the rows of its children narrow them down)."""
    return ", ".join(labels) if len(labels) <= 2 else f"{len(labels)} groups"


def _dims(shape: Sequence[int]) -> str:
    return "×".join(str(n) for n in shape)


def _shape(output: ModuleOutput | None) -> str:
    """``1×64×56×56``; ``+2`` for more tensors returned; nothing for a module that did
    not run."""
    if output is None:
        return ""
    more = f" +{output.tensors - 1}" if output.tensors > 1 else ""
    return (_dims(output.shape) or "scalar") + more if output.tensors else "no tensor"


def summary(report: SummaryReport, width: int | None = None) -> Rendered:
    """The module table. Names are indented with padding, not spaces, so no name wraps (a
    path cut in two reads as two names). Columns nothing fills (BatchNorm in a transformer,
    group and lr without an optimizer) are left out. What matters most is on the left
    (name, state, params); a narrow width hides BatchNorm, group, type and lr, in that
    order."""
    with_bn = any(row.bn for row in report.rows)
    with_groups = bool(report.groups)
    columns: list[tuple[str, JustifyMethod]] = [
        ("module", "left"),
        ("state", "left"),
        ("params", "right"),
        ("type", "left"),
    ]
    columns += [("lr", "right"), ("group", "left")] if with_groups else []
    columns += [("BatchNorm", "left")] if with_bn else []
    columns += [("output", "right"), ("activation", "right")] if report.shapes else []
    # the group column gives way when the rest do not fit (its labels wrap at spaces);
    # names, numbers and the BatchNorm counts stay on one line
    whole = [name for name, _ in columns if name != "group"]
    order = ("BatchNorm", "group", "activation", "lr", "type", "output")
    hide = [name for name in order if name in dict(columns)]
    drawn = table(f"{report.model_name} ({report.model_kind})", columns, whole, hide)
    for row in report.rows:
        name = row.name.rsplit(".", 1)[-1] if row.depth else row.name
        cells: list[RenderableType] = [
            Padding(name, (0, 0, 0, 2 * row.depth)),  # an indent, not spaces to wrap at
            Text(row.state, style=_STATE_STYLE.get(row.state, "")),
            human(row.params) if row.params else "",
            f"{row.kind} · lora r={row.lora_rank}" if row.lora_rank else row.kind,
        ]
        if with_groups:
            labels = [group_label(report.groups[i]) for i in row.groups]
            cells += [_lr_range(report.lrs(row)), _group_cell(labels)]
        if with_bn:
            cells.append(" ".join(f"{mode} {n}" for mode, n in row.bn.items()))
        if report.shapes:
            out = row.output
            cells += [_shape(out), human_bytes(out.nbytes) if out else ""]
        drawn.add_row(*cells)
    c = report.counts
    parts: list[RenderableType] = [drawn]
    if report.hidden_rows:
        parts.append(
            Text(
                f"… {report.hidden_rows} more rows not shown (use --depth to choose)",
                style=theme.style("dim"),
            )
        )
    facts = [
        f"total {human(c.total)} params ({human_bytes(c.param_bytes)})",
        f"trainable {human(c.trainable)} ({share(c.trainable_pct)})",
        f"frozen {human(c.frozen)}",
        f"buffers {human_bytes(c.buffer_bytes)}",
        f"depth {report.depth}",
    ]
    if report.shapes:
        shapes = report.shapes
        facts += [
            f"input {_dims(shapes.input_shape)}",
            f"activations {human_bytes(shapes.activation_bytes)} (every layer's output, "
            "one forward)",
        ]
    parts.append(Facts(facts, drawn))
    if report.adapter_params:
        parts.append(Text(f"LoRA adapters: {human(report.adapter_params)} params"))
    if report.groups:
        parts += _groups(report.groups, report.optimizer_name)
    return Rendered(Group(*parts), width)


def _undone(commands: Sequence[Command]) -> str:
    return f"{len(commands)} undone: {_names([fix_text(c) for c in commands], shown=3)}"


def _why_not_live(stale: str) -> str:
    """A resumed command is applied (just not undoable); the others are stale."""
    return stale if stale == REPLAYED else f"no: {stale or REBOUND}"


def history(
    entries: Sequence[HistoryEntry], width: int | None = None, undone: Sequence[Command] = ()
) -> Rendered:
    """The commands in effect; ``undone``: those ``%tm undo`` reverted, oldest first."""
    if not entries:
        text = f"no commands in effect: {_undone(undone)}" if undone else "no commands yet"
        return Rendered(Text(text, style=theme.style("dim")), width)
    drawn = table(
        "torchmagic history",
        [
            ("#", "right"),
            ("command", "left"),
            ("undo", "left"),
            ("modules", "left"),
            ("model", "left"),
        ],
        whole=("#", "model", "undo"),
        hide=("model", "modules"),
    )
    for e in entries:  # what a narrow cell must show (#, command, undo) on the left
        drawn.add_row(
            str(e.index),
            fix_text(e.command),
            "yes" if e.live else Text(_why_not_live(e.stale), style=theme.style("dim")),
            _names(e.modules),
            e.model_name,
        )
    if undone:
        return Rendered(Group(drawn, Text(_undone(undone), style=theme.style("dim"))), width)
    return Rendered(drawn, width)


def message(text: str, width: int | None = None) -> Rendered:
    return Rendered(Text(text), width)
