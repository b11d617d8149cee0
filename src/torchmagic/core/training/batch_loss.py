"""One batch's loss under the plan's AMP policy, refused in one line when it cannot be
a loss; and the plain optimizer step on one batch the lr range test takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..advice import Advice, Call
from ..errors import TorchMagicError
from ..surgery import heads
from .data import IGNORE_INDEX, call_model

if TYPE_CHECKING:
    from .fit_plan import FitPlan


def main_output(output: Any) -> Any:
    """torchvision's GoogLeNet/Inception return namedtuples in train mode: use ``.logits``."""
    return getattr(output, "logits", output)


def _shape_of(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _loss_of(plan: FitPlan, output: Any, targets: Any, first: bool) -> torch.Tensor:
    """The loss of one batch. On the first step a loss that cannot take the model's
    outputs and the batch's targets is refused in one line (nothing has trained yet);
    a loss that is not one number is refused at any step (backward needs a scalar), and
    a first loss that no trainable parameter made."""
    try:
        loss = plan.loss_fn(output, targets)
    except (TorchMagicError, torch.OutOfMemoryError):  # already one line; not the loss's
        raise
    except (TypeError, ValueError, RuntimeError, IndexError, AttributeError) as error:
        _refuse_label_past_head(plan, output, targets, error)
        if not first:
            raise
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise TorchMagicError(
            f"the loss fails on the first batch (outputs: {_shape_of(output)}, targets: "
            f"{_shape_of(targets)}): {type(error).__name__}" + (f": {text}" if text else ""),
            param="loss",
        ) from error
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TorchMagicError(
            f"the loss must return one number (a tensor with one element), got {_shape_of(loss)}",
            param="loss",
        )
    if first and torch.is_grad_enabled() and not loss.requires_grad:
        raise TorchMagicError(  # backward would fail with torch's own traceback
            f"nothing in {plan.model_name} that trains makes the loss (every parameter the "
            "forward uses is frozen, or the trainable ones are LoRA adapters switched off): "
            "unfreeze a block or switch the adapters on"
        )
    return loss


def _refuse_label_past_head(plan: FitPlan, output: Any, targets: Any, error: Exception) -> None:
    """A loss that failed on class labels outside the outputs (at any step: a later batch
    of a dataset with more classes than the head) is refused in one line naming the
    label, the head's size and the fix; anything else is left to the caller."""
    if not (
        isinstance(output, torch.Tensor)
        and output.ndim >= 2
        and isinstance(targets, torch.Tensor)
        and targets.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
        and output.shape[:1] == targets.shape[:1]
    ):
        return
    labels = targets[targets != IGNORE_INDEX]
    classes = output.shape[1]
    if not labels.numel():
        return
    low, high = int(labels.min()), int(labels.max())
    if 0 <= low and high < classes:
        return
    try:
        head: heads.Head | None = heads.find_head(plan.model)
    except TorchMagicError:
        head = None
    where = (
        f"the head {plan.model_name}.{head.name}"
        if head is not None and head.name and head.out_features == classes
        else f"the output of {plan.model_name}"
    )
    fix: Advice = (f"map the labels to 0..{classes - 1}",)
    if high >= classes and head is not None and where.startswith("the head"):
        fix = (
            Call("replace_head", (f"{plan.model_name}.{head.name}", high + 1)),
            f" for {high + 1} classes, or map the labels to 0..{classes - 1}",
        )
    raise TorchMagicError(
        (
            f"a batch has label {high if high >= classes else low} but {where} has "
            f"{classes} outputs (labels 0 to {classes - 1}): ",
            *fix,
        )
    ) from error


def forward_loss(
    plan: FitPlan,
    forward: Callable[[Any], Any],
    inputs: Any,
    targets: torch.Tensor,
    first: bool = False,
) -> torch.Tensor:
    """The batch's loss under the plan's AMP policy (autocast covers forward and loss);
    ``first``: the run's first batch, where a loss that does not fit is a refusal (see
    :func:`_loss_of`)."""
    with plan.amp.autocast():
        output = main_output(call_model(forward, inputs))
        return _loss_of(plan, output, targets, first)


def train_step(
    plan: FitPlan,
    forward: Callable[[Any], Any],
    inputs: Any,
    targets: torch.Tensor,
    first: bool = False,
) -> torch.Tensor:
    """One optimizer step on one batch (no accumulation, no clipping: the lr range test's
    step); the loss stays on the device (reading it is the caller's choice: a host sync).
    ``first``: the run's first step (see :func:`forward_loss`)."""
    loss = forward_loss(plan, forward, inputs, targets, first)
    plan.amp.step(loss, plan.optimizer)
    return loss.detach()
