"""The doctor's checks, one module per group of mistakes.

A new check is one function in the module of its group, registered with that module's
``checks`` (a :class:`~torchmagic.core.diagnostics.registry.CheckGroup`) by what it looks
at::

    @checks.each_optimizer   # once per optimizer: check(context, name, optimizer)
    @checks.each_model       # once per model: check(context, model), a ModelEntry
    @checks.namespace        # once per scan: check(context)

It yields :class:`~torchmagic.core.diagnostics.findings.Finding` s and changes nothing;
``context`` (a :class:`~torchmagic.core.diagnostics.context.DoctorContext`) holds what the
scan gathered once: the namespace, its models with the optimizers that train them, the
active GradScalers, the session's AMP policy, device, weights and runs. A new group is a new
module here with its own ``checks = CheckGroup()``, added to ``GROUPS``.

Order: the optimizer checks run first, then the model checks, then the namespace checks;
within each, group by group as in ``GROUPS``, a group's checks as its module defines them.
The report lists findings most severe first, in that order within a severity.
"""

from __future__ import annotations

from ..registry import CheckGroup
from . import (
    batchnorm,
    data,
    devices,
    ema,
    holders,
    leaks,
    libraries,
    loader,
    optimizers,
    precision,
    schedulers,
    wrappers,
)

GROUPS: tuple[CheckGroup, ...] = (
    optimizers.checks,  # parameters and the optimizer
    devices.checks,  # tensors and models on the wrong device
    batchnorm.checks,  # frozen BatchNorm still updating its statistics
    precision.checks,  # autocast and GradScaler
    data.checks,  # data, weights and head that must match
    loader.checks,  # the loader sets the pace
    schedulers.checks,  # schedulers out of step
    leaks.checks,  # graphs kept alive
    wrappers.checks,  # DataParallel, compiled models changed
    ema.checks,  # EMA copies that no longer match
    libraries.checks,  # library trainers out of step (transformers, fastai)
    holders.checks,  # objects that set lrs or trainability on their own
)
