"""Wrappers: DataParallel, and compiled models changed after torch.compile."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from ..compiled import is_compiled
from ..context import DoctorContext
from ..findings import Finding, first_names
from ..registry import CheckGroup

checks = CheckGroup()


@checks.namespace
def wrappers(context: DoctorContext) -> Iterator[Finding]:
    """Each module bound in the namespace, as bound: its DataParallel wrapper, then what
    changed in it since it was compiled (known only with the session's CompileWatch)."""
    watch = context.compile_watch
    for name, value in context.ws.items():
        if not isinstance(value, nn.Module):
            continue
        if isinstance(value, nn.DataParallel) and not value.device_ids:  # built without GPUs
            yield Finding(
                "data-parallel",
                "info",
                name,
                "nn.DataParallel without a GPU only wraps the model: it runs the model "
                "itself, with nothing in parallel",
                f"use {name}.module (the model itself); on GPUs, DistributedDataParallel "
                "launched with torchrun",
            )
        elif isinstance(value, nn.DataParallel):
            yield Finding(
                "data-parallel",
                "warning",
                name,
                "nn.DataParallel: one process driving every GPU through threads, slower than "
                "DistributedDataParallel even on one machine",
                "DistributedDataParallel, launched with torchrun (one process per GPU)",
            )
        if watch is not None and is_compiled(value):
            changes = "; ".join(
                f"{what} {first_names(names)}" for what, names in watch.changes(value)
            )
            if changes:
                yield Finding(
                    "compiled-changed",
                    "warning",
                    name,
                    f"{name} changed after torch.compile ({changes}): every change "
                    "recompiles, and past the recompile limit it runs eagerly",
                    f"call torch.compile again after the surgery and rebind {name} (or compile "
                    "once, after the last change)",
                )
