"""torch's and timm's helpers around a model or an optimizer.

EMA copies of a model: torch's ``AveragedModel`` (``torch.optim.swa_utils``) and
timm's ``ModelEma`` / ``ModelEmaV2`` / ``ModelEmaV3``. Each keeps a deep copy of the
model at ``.module`` and averages the model's parameters into it, parameter by parameter,
so its structure must follow every structural change of the model.

timm's ``Lookahead`` steps its base optimizer and keeps every per-parameter state there
(the base's moments and its own ``lookahead_slow_buff``), sharing the base's
``param_groups`` list: ``STATE_IN`` names where (see :func:`.lookup.state_of`)."""

from __future__ import annotations

from torch import nn

from .classes import named

WRAPS: dict[str, str] = {}
# optimizer class → the attribute holding the optimizer whose ``state`` it uses
STATE_IN = {"Lookahead": "_base_optimizer"}

_EMA_CLASSES = ("AveragedModel", "ModelEma", "ModelEmaV2", "ModelEmaV3")


def members(obj: object) -> list[tuple[str, object]]:
    return []


def averaged(obj: object) -> nn.Module | None:
    """The averaged copy inside ``obj`` when ``obj`` is an EMA helper, else None
    (timm's first ``ModelEma`` keeps it at ``.ema``)."""
    if not named(obj, *_EMA_CLASSES):
        return None
    inner = getattr(obj, "module", None)
    if not isinstance(inner, nn.Module):
        inner = getattr(obj, "ema", None)
    return inner if isinstance(inner, nn.Module) else None
