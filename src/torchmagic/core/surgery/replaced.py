"""A module the user assigned by hand (``model.fc = nn.Linear(512, 10)``): the optimizer
still holds the replaced module's tensors, where the model had them, and none of the new
one's. Found by their place in the groups, so that the new module can take those places
(``unfreeze``) and the doctor can say what happened."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .optimizer_sync import group_index


def _runs(
    opt: torch.optim.Optimizer, anchors: Sequence[nn.Parameter | None], model_ids: set[int]
) -> list[list[nn.Parameter]]:
    """Tensors outside the model right after the anchor before the module, right before
    the one after it, and whole groups of them (a head with a group of its own)."""
    before, after = anchors
    runs: list[list[nn.Parameter]] = []
    for group in opt.param_groups:
        params = list(group["params"])
        for anchor, step in ((before, 1), (after, -1)):
            at = next((i for i, p in enumerate(params) if p is anchor), None)
            if at is None:
                continue
            run: list[nn.Parameter] = []
            i = at + step
            while 0 <= i < len(params) and id(params[i]) not in model_ids:
                run.append(params[i])
                i += step
            runs.append(run if step == 1 else run[::-1])
        if params and all(id(p) not in model_ids for p in params):
            runs.append(params)
    return runs


def predecessors(
    opt: torch.optim.Optimizer, model: nn.Module, module: nn.Module
) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(old, new) pairs when ``module`` (of ``model``) replaced, by assignment, a module
    whose tensors the optimizer still holds in its place: as many, of the same ranks, in
    the same order. Empty when the optimizer holds any of ``module``'s parameters, any is
    frozen, or no such tensors are where the module's would be."""
    new = list(module.parameters())
    held = group_index(opt)
    if not new or any(id(p) in held or not p.requires_grad for p in new):
        return []  # a fresh module trains; a frozen one in no group went home, not astray
    params = [p for _, p in model.named_parameters()]
    model_ids = {id(p) for p in params}
    mine = {id(p) for p in new}
    places = [i for i, p in enumerate(params) if id(p) in mine]
    before = next((p for p in reversed(params[: places[0]]) if id(p) in held), None)
    after = next((p for p in params[places[-1] + 1 :] if id(p) in held), None)
    for run in _runs(opt, (before, after), model_ids):
        if len(run) == len(new) and all(o.dim() == n.dim() for o, n in zip(run, new, strict=True)):
            return list(zip(run, new, strict=True))
    return []
