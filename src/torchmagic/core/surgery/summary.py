"""A bounded table of a model's modules: parameters, trainable state, BatchNorm mode,
optimizer group and lr per row.

One pass over ``named_modules`` attributes each parameter (once, tied weights included)
and each BatchNorm to its row at the requested depth; deep trees are cut to the depth and
row budget instead of flooding the notebook.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..modules import is_batchnorm
from . import batchnorm, lora
from .counting import count, describe_groups
from .optimizer_sync import group_index
from .results import SummaryReport, SummaryRow
from .shapes import output_shapes

_BN_ORDER = ("held", "frozen", "eval", "train")


def _state(params: int, trainable: int) -> str:
    if not params:
        return ""
    if trainable == params:
        return "trainable"
    return "frozen" if trainable == 0 else "partial"


def summarize(
    model: nn.Module,
    *,
    model_name: str,
    optimizer: torch.optim.Optimizer | None = None,
    optimizer_name: str | None = None,
    schedulers: Sequence[object] = (),
    scheduler_names: Mapping[int, str] | None = None,
    depth: int = 2,
    max_rows: int = 60,
    input_shape: Sequence[int] | None = None,
) -> SummaryReport:
    """Rows for modules down to ``depth``; the depth shrinks until the rows fit ``max_rows``.
    ``schedulers``: those bound to ``optimizer``, to tell each group's base lr (named by
    ``scheduler_names``, by identity). With ``input_shape`` (batch first), each row also
    has its module's output shape and bytes from one forward on the meta device."""
    shapes = None if input_shape is None else output_shapes(model, input_shape)
    named = list(model.named_modules())
    depth = min(depth, max(n.count(".") + 1 for n, _ in named))  # deeper shows nothing more
    while depth > 0 and sum(1 for n, _ in named if not n or n.count(".") < depth) > max_rows:
        depth -= 1
    keep = {n for n, _ in named if not n or n.count(".") < depth}

    def row_of(name: str) -> str:
        while name not in keep:
            name = name.rpartition(".")[0]
        return name

    where = group_index(optimizer) if optimizer is not None else {}
    numel: dict[str, int] = defaultdict(int)
    trainable: dict[str, int] = defaultdict(int)
    in_groups: dict[str, set[int]] = defaultdict(set)
    bn: dict[str, Counter] = defaultdict(Counter)
    seen: set[int] = set()
    for name, module in named:
        key = row_of(name)
        ancestors = [key]
        while ancestors[-1]:
            ancestors.append(ancestors[-1].rpartition(".")[0])
        if is_batchnorm(module):
            for a in ancestors:
                bn[a][batchnorm.mode(module)] += 1
        for p in module._parameters.values():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            for a in ancestors:
                numel[a] += p.numel()
                if p.requires_grad:
                    trainable[a] += p.numel()
                if id(p) in where:
                    in_groups[a].add(where[id(p)])
    ranks = lora.ranks(model)
    rows = []
    for name, module in named:
        if name not in keep:
            continue
        modes = bn[name]
        rows.append(
            SummaryRow(
                name=name or model_name,
                depth=name.count(".") + 1 if name else 0,
                kind=type(module).__name__,
                params=numel[name],
                trainable=trainable[name],
                state=_state(numel[name], trainable[name]),
                bn={m: modes[m] for m in _BN_ORDER if modes[m]},
                groups=tuple(sorted(in_groups[name])),
                lora_rank=ranks.get(name, 0),
                output=None if shapes is None else shapes.outputs.get(name),
            )
        )
    hidden = max(0, len(rows) - max_rows)
    return SummaryReport(
        model_name=model_name,
        model_kind=type(model).__name__,
        rows=tuple(rows[:max_rows]),
        hidden_rows=hidden,
        depth=depth,
        counts=count(model),
        optimizer_name=optimizer_name,
        groups=describe_groups(optimizer, schedulers=schedulers, names=scheduler_names),
        adapter_params=lora.adapter_count(model),
        shapes=shapes,
    )
