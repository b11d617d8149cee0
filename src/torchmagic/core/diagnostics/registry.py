"""The doctor's registry: each group module's checks by scope, and the order they run in."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from .context import DoctorContext, ModelEntry
from .findings import Finding

OptimizerCheck = Callable[[DoctorContext, str, torch.optim.Optimizer], Iterable[Finding]]
ModelCheck = Callable[[DoctorContext, ModelEntry], Iterable[Finding]]
NamespaceCheck = Callable[[DoctorContext], Iterable[Finding]]


class CheckGroup:
    """One group module's checks, by scope, in the order the module defines them. Each
    method registers the function it decorates and returns it unchanged."""

    def __init__(self) -> None:
        self.optimizer_checks: list[OptimizerCheck] = []
        self.model_checks: list[ModelCheck] = []
        self.namespace_checks: list[NamespaceCheck] = []

    def each_optimizer(self, check: OptimizerCheck) -> OptimizerCheck:
        """Run once per optimizer in the namespace: ``check(context, name, optimizer)``."""
        self.optimizer_checks.append(check)
        return check

    def each_model(self, check: ModelCheck) -> ModelCheck:
        """Run once per model in the namespace, trained or not: ``check(context, model)``."""
        self.model_checks.append(check)
        return check

    def namespace(self, check: NamespaceCheck) -> NamespaceCheck:
        """Run once per scan: ``check(context)``."""
        self.namespace_checks.append(check)
        return check


def run(groups: Sequence[CheckGroup], context: DoctorContext) -> Iterator[Finding]:
    """Every check of ``groups`` over ``context``: the per-optimizer checks (optimizer by
    optimizer), then the per-model checks (model by model), then the namespace checks;
    within a scope, group by group, each group's checks in their order."""
    for name, optimizer in context.optimizers:
        for group in groups:
            for optimizer_check in group.optimizer_checks:
                yield from optimizer_check(context, name, optimizer)
    for model in context.models:
        for group in groups:
            for model_check in group.model_checks:
                yield from model_check(context, model)
    for group in groups:
        for namespace_check in group.namespace_checks:
            yield from namespace_check(context)
