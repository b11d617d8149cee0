"""Doctor: the classic transfer-learning mistakes, found in the live namespace.

Each check reads the live objects (models, optimizers, schedulers, GradScalers, the
session's AMP policy) and reports what is wrong, how bad it is, and a one-line fix. Nothing
is changed. A healthy session reports nothing. The checks live in :mod:`.checks`, one
module per group, each a function registered there (its docstring says how to add one);
this module gathers the context once, runs them all and assembles the report.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import torch

from ..surgery.history import History
from ..workspace import Workspace
from .checks import GROUPS
from .compiled import CompileWatch
from .context import AmpState, DoctorContext, gather
from .findings import SEVERITIES, Finding
from .registry import run


@dataclass(frozen=True)
class DoctorReport:
    findings: tuple[Finding, ...]  # most severe first
    scanned: tuple[str, ...]  # what was looked at: "model (ResNet)", "optimizer (AdamW)"


def diagnose(
    namespace: MutableMapping,
    *,
    hidden: Container[str] = (),
    amp: AmpState | None = None,
    scaler: torch.amp.GradScaler | None = None,
    compile_watch: CompileWatch | None = None,
    device: torch.device | None = None,
    weights: Mapping[str, object] | None = None,
    replaced_heads: Container[str] = (),
    fits: Sequence[object] = (),
    pinbench: object | None = None,
    history: History | None = None,
) -> DoctorReport:
    """Run every check over the namespace and the session's state: its AMP policy and
    scaler, its device (models being trained elsewhere are named) and its
    :class:`CompileWatch` (without one, compiled models cannot be compared to what they
    were; it observes this namespace afterwards).

    ``weights``: model name → the weights ``load_model`` built it with (a ``WeightsEnum``
    member, a ``WeightsInfo`` or a ``LoadedModel``); ``replaced_heads``: models whose head
    the session replaced; ``fits``: the session's runs (the last one's data wait is
    judged); ``pinbench``: the last pinbench report, quoted in the remedies;
    ``history``: the session's undo history (a model whose history another session holds
    is named: this one's commands on it would be refused)."""
    context = gather(
        Workspace(namespace, hidden),
        amp=amp,
        scaler=scaler,
        compile_watch=compile_watch,
        device=device,
        weights=weights or {},
        replaced_heads=replaced_heads,
        fits=fits,
        pinbench=pinbench,
        history=history,
    )
    findings = sorted(run(GROUPS, context), key=lambda f: SEVERITIES.index(f.severity))
    if compile_watch is not None:
        compile_watch.observe(namespace, hidden)
    return DoctorReport(tuple(findings), _scanned(context))


def _scanned(context: DoctorContext) -> tuple[str, ...]:
    scanned = [f"{m.name} ({type(m.module).__name__})" for m in context.models]
    scanned += [f"{n} ({type(o).__name__})" for n, o in context.optimizers]
    scanned += [f"GradScaler ({s._device})" for s in context.scalers]
    if context.amp is not None:
        scanned.append("AMP " + ("on" if context.amp.enabled else "off"))
    return tuple(scanned)
