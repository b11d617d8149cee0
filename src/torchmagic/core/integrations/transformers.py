"""transformers: a ``Trainer`` builds its optimizer and schedule at the first ``train()``
(``create_optimizer_and_scheduler``, only while ``trainer.optimizer`` is None) from the
parameters of ``trainer.model`` that train then, and keeps both across later ``train()``
calls (wrapped by Accelerate, which the discovery walk sees through)."""

from __future__ import annotations

from torch import nn

from ..modules import unwrap
from ..numbers import short
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
        f"has no optimizer yet: its train() builds {optim} (lr {short(args.learning_rate)}, "
        f"weight decay {args.weight_decay:g}, {schedule} schedule"
        f"{f', warmup {warmup:g}' if warmup else ''}) over the parameters that train then, "
        "so the adapters and none of the frozen weights; later train() calls keep it"
    )


def build_now(name: str) -> str:
    """How to get a Trainer's groups before ``train()`` builds them."""
    return f"call {name}.create_optimizer() first (train() then keeps it and its groups)"


def checkpoint_groups(obj: object) -> tuple[str, int] | None:
    """(path, number of param groups) of the newest checkpoint in a Trainer's
    ``output_dir`` that holds an optimizer state, else None."""
    import os

    import torch

    directory = getattr(getattr(obj, "args", None), "output_dir", None)
    if not is_trainer(obj) or not directory or not os.path.isdir(directory):
        return None
    steps = [
        (int(d.rpartition("-")[2]), d)
        for d in os.listdir(directory)
        if d.startswith("checkpoint-") and d.rpartition("-")[2].isdigit()
    ]
    for _, d in sorted(steps, reverse=True):
        path = os.path.join(directory, d, "optimizer.pt")
        if os.path.isfile(path):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            return path, len(state.get("param_groups", ()))
    return None


def resume_fails(name: str, obj: object, groups: int) -> str | None:
    """Why ``name``'s ``train(resume_from_checkpoint=…)`` fails on an optimizer with
    ``groups`` param groups: transformers loads the saved state group by group."""
    if not is_trainer(obj):  # its callback handler holds the optimizer too
        return None
    saved = checkpoint_groups(obj)
    if saved is None:
        return (
            f"{name}'s checkpoints now save {groups} param groups: to resume one in a fresh "
            "Trainer, repeat this command before train(resume_from_checkpoint=...)"
        )
    path, count = saved
    if count == groups:
        return None
    return (
        f"{name}.train(resume_from_checkpoint=...) would fail: {path} saved {count} param "
        f"groups, {name}.optimizer has {groups}; resume before editing, or save a new checkpoint"
    )


def out_of_step(name: str, obj: object) -> tuple[str, str] | None:
    """(what is wrong, the fix) when a Trainer's newest checkpoint cannot be resumed
    with the optimizer it holds now, else None."""
    held = getattr(obj, "optimizer", None)
    saved = checkpoint_groups(obj) if held is not None else None
    groups = len(held.param_groups) if saved is not None else 0  # type: ignore[union-attr]
    if saved is None or saved[1] == groups:
        return None
    return (
        f"{name}.train(resume_from_checkpoint=...) fails: {saved[0]} saved {saved[1]} param "
        f"groups, {name}.optimizer has {groups} (transformers loads the state group by group)",
        f"resume in a fresh Trainer before editing its groups, or save a new checkpoint "
        f"({name}.save_state() and {name}.train() again)",
    )
