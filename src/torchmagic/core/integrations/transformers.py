"""transformers: a ``Trainer`` builds its optimizer and schedule at the first ``train()``
(``create_optimizer_and_scheduler``, only while ``trainer.optimizer`` is None) from the
parameters of ``trainer.model`` that train then, and keeps both across later ``train()``
calls (wrapped by Accelerate, which the discovery walk sees through)."""

from __future__ import annotations

from torch import nn

from ..modules import unwrap
from .classes import named


def members(obj: object) -> list[tuple[str, object]]:
    """Nothing beyond the public attributes: ``trainer.optimizer`` and
    ``trainer.lr_scheduler`` are plain ones (Accelerate's wrappers once trained)."""
    return []


def is_trainer(obj: object) -> bool:
    return named(obj, "Trainer") and type(obj).__module__.startswith("transformers")


def optimizer_to_come(obj: object, model: nn.Module) -> str | None:
    """What a Trainer of ``model`` that has no optimizer yet will build at ``train()``,
    in words; None for anything else."""
    held = getattr(obj, "model", None)
    if not is_trainer(obj) or getattr(obj, "optimizer", True) is not None:
        return None
    if not isinstance(held, nn.Module) or unwrap(held) is not model:
        return None
    args = obj.args  # type: ignore[attr-defined]
    optim, schedule = (getattr(v, "value", v) for v in (args.optim, args.lr_scheduler_type))
    warmup = getattr(args, "warmup_steps", 0) or getattr(args, "warmup_ratio", 0)
    return (
        f"has no optimizer yet: its train() builds {optim} (lr {args.learning_rate:g}, "
        f"weight decay {args.weight_decay:g}, {schedule} schedule"
        f"{f', warmup {warmup:g}' if warmup else ''}) over the parameters that train then, "
        "so the adapters and none of the frozen weights; later train() calls keep it"
    )
