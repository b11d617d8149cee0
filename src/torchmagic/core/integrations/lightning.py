"""PyTorch Lightning: a ``Trainer`` holds the optimizers and scheduler configs its
``LightningModule.configure_optimizers`` built, and builds them again at every
``trainer.fit``; a ``LightningModule`` reaches its trainer once attached."""

from __future__ import annotations

from .classes import named

WRAPS = {"LightningOptimizer": "optimizer", "LRSchedulerConfig": "scheduler"}

REBUILT = "builds it again at every fit, in configure_optimizers"


def members(obj: object) -> list[tuple[str, object]]:
    """Where a trainer keeps optimizers and schedulers (properties, so no attribute walk
    sees them), and the trainer of an attached LightningModule."""
    if named(obj, "Trainer"):
        strategy = getattr(obj, "strategy", None)
        optimizers = list(getattr(strategy, "_optimizers", None) or [])
        configs = list(getattr(strategy, "lr_scheduler_configs", None) or [])
        return [(f".optimizers[{i}]", o) for i, o in enumerate(optimizers)] + [
            (f".lr_scheduler_configs[{i}].scheduler", c.scheduler)
            for i, c in enumerate(configs)
            if getattr(c, "scheduler", None) is not None
        ]
    if named(obj, "LightningModule"):
        trainer = getattr(obj, "_trainer", None)
        return [] if trainer is None else [(".trainer", trainer)]
    return []


def rebuilds(obj: object) -> bool:
    """Whether the optimizers found through ``obj`` are re-created at the next fit."""
    return named(obj, "Trainer") or named(obj, "LightningModule")
