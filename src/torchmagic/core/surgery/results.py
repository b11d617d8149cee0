"""Frozen result objects: what the engine returns and the render layer draws.

They hold numbers, counts, indices and plain identifiers, never formatted text: how a
value reads (``1e-4``, ``12.3M``, ``held 4``) is the render layer's choice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..advice import Advice, Command
from .shapes import ModuleOutput, Shapes


@dataclass(frozen=True)
class Counts:
    """Parameter totals of a model (tied parameters counted once)."""

    total: int
    trainable: int
    tensors: int
    param_bytes: int
    buffer_bytes: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    @property
    def trainable_pct(self) -> float:
        return 100.0 * self.trainable / self.total if self.total else 0.0


@dataclass(frozen=True)
class GroupInfo:
    """One optimizer param group as the user sees it."""

    index: int
    name: str
    lr: float | None  # the lr the next step uses; None: the optimizer computes its own
    weight_decay: float | None
    tensors: int
    numel: int
    status: str = ""  # "new", "changed" or "" (as before the command)
    base_lr: float | None = None  # what the schedule scales (``initial_lr``); None: no schedule
    schedulers: tuple[str, ...] = ()  # class names of the schedulers stepping it, outermost


@dataclass(frozen=True)
class Effect:
    """What one surgery step did, beyond the counts the session measures itself.

    ``modules``: the blocks acted on (those with parameters or BatchNorm), or, when
    ``excluded`` is not empty, what the targets named ("" for the whole model) before the
    exclusions were carved out. ``params``: how many parameters changed trainability.
    ``already``: blocks that were already as the command leaves them. ``resynced``:
    parameters whose trainability was already right (set by hand) but whose optimizer
    membership was not, so the command took them out of it (freeze) or put them in (unfreeze)."""

    modules: tuple[str, ...]
    params: int
    state_freed_bytes: int = 0
    bn_modes: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str | Advice, ...] = ()  # advice names commands each front end spells
    already: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    resynced: int = 0


@dataclass(frozen=True)
class Change:
    """The outcome of a mutating command (or of its dry run, or of an undo)."""

    action: str
    command: Command  # as typed, or the session call each front end spells
    model_name: str
    effect: Effect
    before: Counts
    after: Counts
    optimizer_name: str | None
    groups: tuple[GroupInfo, ...]
    dry_run: bool = False
    unchanged: bool = False  # the command found everything as it would leave it


@dataclass(frozen=True)
class SummaryRow:
    name: str
    depth: int
    kind: str
    params: int
    trainable: int
    state: str  # "trainable", "frozen", "partial" or "" (no parameters)
    bn: Mapping[str, int]  # BatchNorm layers inside by mode ("held", "frozen", "eval", "train")
    groups: tuple[int, ...]  # indices of the optimizer groups holding its parameters
    lora_rank: int = 0  # the rank of a LoRA layer's active adapter (0: not one)
    output: ModuleOutput | None = None  # with an input shape: what it returned (None: not run)


@dataclass(frozen=True)
class SummaryReport:
    model_name: str
    model_kind: str
    rows: tuple[SummaryRow, ...]
    hidden_rows: int
    depth: int
    counts: Counts
    optimizer_name: str | None
    groups: tuple[GroupInfo, ...]  # every group of the optimizer, ``groups[i].index == i``
    adapter_params: int = 0  # parameters of LoRA adapters (in ``counts`` too)
    shapes: Shapes | None = None  # with an input shape: the meta forward's outputs

    def lrs(self, row: SummaryRow) -> tuple[float | None, ...]:
        """The lrs (now) of the groups holding ``row``'s parameters (None: the optimizer
        computes its own)."""
        return tuple(self.groups[i].lr for i in row.groups)


@dataclass(frozen=True)
class Replay:
    """A command as the Session call that makes it again on a model built the same way:
    the method, its targets relative to the model ("" is the whole model) and its
    keyword arguments, all plain values (what a checkpoint stores and an export spells)."""

    method: str  # freeze, unfreeze, replace_head, set_base_lrs (fit: exports only)
    targets: tuple[str, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()

    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)


@dataclass(frozen=True)
class HistoryEntry:
    index: int
    command: Command  # as typed, or the session call each front end spells
    action: str
    model_name: str
    modules: tuple[str, ...]
    live: bool  # False once it cannot be undone any more (``stale`` says why)
    stale: str = ""  # "model rebound", "optimizer re-created", "replayed from a checkpoint"
    replay: Replay | None = None  # how to make it again (None: it cannot be replayed)


@dataclass(frozen=True)
class CommandHistory:
    """The session's mutating commands, oldest first, and those undone."""

    entries: tuple[HistoryEntry, ...]
    undone: tuple[Command, ...] = ()
