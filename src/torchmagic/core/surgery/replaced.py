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


class Replaced:
    """Finds, in one ``model`` and ``opt``, modules assigned by hand over a module whose
    tensors ``opt`` still holds; what it needs of both is read once, so that asking of
    every module of the model stays linear."""

    def __init__(
        self,
        opt: torch.optim.Optimizer,
        model: nn.Module,
        parameters: Sequence[nn.Parameter] | None = None,
    ) -> None:
        """``parameters``: the model's, each once in ``model.parameters()`` order, when the
        caller has them from its walk."""
        self._opt = opt
        self._held = group_index(opt)
        self._params = list(model.parameters()) if parameters is None else list(parameters)
        self._model_ids = {id(p) for p in self._params}
        self._place = {id(p): i for i, p in enumerate(self._params)}

    def predecessors(
        self, module: nn.Module, parameters: Sequence[nn.Parameter] | None = None
    ) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """(old, new) pairs when ``module`` replaced, by assignment, a module whose tensors
        the optimizer still holds in its place: as many, of the same ranks, in the same
        order. Empty when the optimizer holds any of ``module``'s parameters, any is
        frozen, or no such tensors are where the module's would be. ``parameters``:
        ``module``'s, when the caller has them."""
        new = list(module.parameters()) if parameters is None else list(parameters)
        held = self._held
        if not new or any(id(p) in held or not p.requires_grad for p in new):
            return []  # a fresh module trains; a frozen one in no group went home, not astray
        places = sorted(self._place[id(p)] for p in new if id(p) in self._place)
        if not places:
            return []
        params = self._params
        before = next((p for p in reversed(params[: places[0]]) if id(p) in held), None)
        after = next((p for p in params[places[-1] + 1 :] if id(p) in held), None)
        for run in _runs(self._opt, (before, after), self._model_ids):
            if len(run) == len(new) and all(
                o.dim() == n.dim() for o, n in zip(run, new, strict=True)
            ):
                return list(zip(run, new, strict=True))
        return []
