"""PyTorch Lightning: a ``Trainer`` holds the optimizers and scheduler configs its
``LightningModule.configure_optimizers`` built, and builds them again at every
``trainer.fit``; a ``LightningModule`` reaches its trainer once attached. Fine-tuning
callbacks (``BackboneFinetuning``, finetuning-scheduler's ``FinetuningScheduler``, any
``BaseFinetuning``) set trainability and param groups themselves at the next fit."""

from __future__ import annotations

from torch import nn

from ..modules import unwrap
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


def _does(callback: object) -> str | None:
    """What a fine-tuning callback does at the next fit, in words; None for the others."""
    if named(callback, "FinetuningScheduler"):
        return (
            "freezes all but its schedule's phase 0 at the next fit, then unfreezes and adds "
            "param groups phase by phase: trainability and groups set here do not carry over"
        )
    if named(callback, "BackboneFinetuning"):
        epoch = getattr(callback, "unfreeze_backbone_at_epoch", "?")
        return (
            "freezes the module's backbone again at the next fit and adds it back as a "
            f"param group at epoch {epoch}, whatever is set here"
        )
    if named(callback, "BaseFinetuning"):
        return (
            "sets trainability itself at the next fit (freeze_before_training, finetune_function)"
        )
    return None


def sets_on_its_own(
    obj: object, model: nn.Module, optimizer: object
) -> list[tuple[str, object, str, bool]]:
    """The fine-tuning callbacks of a trainer whose module holds ``model`` (or that has
    fitted no module yet): (path suffix, the callback, what it does, False)."""
    if not named(obj, "Trainer"):
        return []
    strategy = getattr(obj, "strategy", None)
    module = getattr(strategy, "_lightning_module", None)
    if isinstance(module, nn.Module) and not any(m is model for m in unwrap(module).modules()):
        return []
    out = []
    for i, callback in enumerate(list(getattr(obj, "callbacks", None) or [])):
        does = _does(callback)
        if does is not None:
            out.append((f".callbacks[{i}]", callback, does, False))
    return out
