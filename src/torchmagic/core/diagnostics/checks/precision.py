"""Mixed precision: autocast dtypes that do not fit the device, and GradScalers where
they fail or only cost time."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from ...advice import Call
from ..context import DoctorContext
from ..findings import Finding
from ..registry import CheckGroup

checks = CheckGroup()


def _half_params(model: nn.Module) -> bool:
    return any(p.dtype == torch.float16 for p in model.parameters())


@checks.namespace
def amp(context: DoctorContext) -> Iterator[Finding]:
    """The session's autocast policy against the device and the active scalers; only
    models an optimizer trains count (a frozen fp16 teacher is fine)."""
    policy, scalers = context.amp, context.scalers
    if policy is not None and policy.enabled and policy.dtype == torch.float16:
        if policy.device_type == "cpu":
            yield Finding(
                "amp",
                "warning",
                "autocast",
                "fp16 autocast on the CPU: slow, and fp16 needs loss scaling",
                (Call("amp_on", ("bf16",)), " (bfloat16 keeps fp32's range)"),
            )
    if not scalers:
        return
    if policy is not None and policy.enabled and policy.dtype == torch.bfloat16:
        yield Finding(
            "amp",
            "warning",
            "GradScaler",
            "a GradScaler with bf16 autocast: bf16 has fp32's range, scaling only costs time",
            ("drop the scaler (or ", Call("amp_on", ("bf16",)), ", which uses none)"),
        )
    for name, model in context.trained.items():
        if _half_params(model):
            yield Finding(
                "amp",
                "error",
                name,
                f"{name} was cast to fp16 (.half()) while a GradScaler is active: unscaling "
                "fp16 gradients fails, and fp16 weights lose small updates",
                (
                    f"{name}.float(), and let autocast run the fp16 maths (",
                    Call("amp_on", ("fp16",)),
                    ")",
                ),
            )
