"""BatchNorm: frozen blocks whose running statistics keep moving."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...surgery.batchnorm import is_held
from ..context import DoctorContext, ModelEntry
from ..findings import Finding, block_call, first_names
from ..registry import CheckGroup

checks = CheckGroup()


def _frozen(module: nn.Module) -> bool:
    params = list(module.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


@checks.each_model
def bn_drift(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """BatchNorm layers of frozen blocks still updating their running statistics: their
    own parameters frozen (or, without affine parameters, their parent's), in train mode,
    and not held in eval by torchmagic's freeze."""
    name = model.name
    modules = dict(model.module.named_modules())
    drifting = []
    for qualified, m in modules.items():
        if not (isinstance(m, _BatchNorm) and m.training and m.track_running_stats):
            continue
        if is_held(m):
            continue
        own = list(m.parameters(recurse=False))
        parent = modules[qualified.rpartition(".")[0]]
        if (own and not any(p.requires_grad for p in own)) or (not own and _frozen(parent)):
            drifting.append(qualified)
    if drifting:
        yield Finding(
            "bn-drift",
            "warning",
            f"{name}: {first_names(drifting)}",
            f"{len(drifting)} BatchNorm layer(s) in frozen blocks are in train mode: their "
            "running statistics keep moving (ignore if you chose bn='train')",
            (
                block_call("freeze", name, drifting),
                f" holds them in eval, also after {name}.train()",
            ),
        )
