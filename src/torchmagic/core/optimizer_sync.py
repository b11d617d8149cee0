"""In-place edits of a live optimizer's param groups and state, each with its inverse.

Parameters are matched by identity. Groups are never deleted (a group emptied by a freeze
stays, so every scheduler's per-group lists keep their length); new groups are appended
with ``add_param_group`` so the optimizer fills in its own defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .transaction import Transaction

# Group keys owned by LR schedulers: set by schedulers.py for new groups, never copied.
SCHEDULE_KEYS = frozenset({"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"})
_IDENTITY_KEYS = frozenset({"params", "param_names", "name"})


def group_index(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """Which param group holds each parameter, by ``id``."""
    return {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}


def group_label(group: dict, index: int) -> str:
    return str(group.get("name", index))


def _copy_group(group: dict) -> dict:
    copy = dict(group)
    copy["params"] = list(group["params"])
    if "param_names" in group:
        copy["param_names"] = list(group["param_names"])
    return copy


def _same_group(group: dict, saved: dict) -> bool:
    return (
        len(group["params"]) == len(saved["params"])
        and all(a is b for a, b in zip(group["params"], saved["params"], strict=True))
        and group.get("lr") == saved.get("lr")
        and group.get("weight_decay") == saved.get("weight_decay")
    )


class OptimizerEditor:
    """Edits one optimizer inside a transaction.

    On construction it remembers the groups; the inverse restores group membership and
    the hyper-parameters of the groups this command touched (found at commit), drops
    groups it added, and leaves the lrs that training moved since in untouched groups.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, tx: Transaction) -> None:
        self.optimizer = optimizer
        self._tx = tx
        groups = list(optimizer.param_groups)
        saved = [_copy_group(g) for g in groups]
        touched: list[set[int] | None] = [None]  # None until commit: roll back everything

        def seal() -> None:
            touched[0] = {
                id(g) for g, s in zip(groups, saved, strict=True) if not _same_group(g, s)
            }

        def restore() -> None:
            for group, copy in zip(groups, saved, strict=True):
                if touched[0] is None or id(group) in touched[0]:
                    group.clear()
                    group.update(_copy_group(copy))
            optimizer.param_groups[:] = groups
            live = {id(p) for g in groups for p in g["params"]}
            for p in [p for p in optimizer.state if id(p) not in live]:
                del optimizer.state[p]  # state of parameters the command had added

        tx.add(restore)
        tx.on_commit(seal)

    @property
    def uses_param_names(self) -> bool:
        return any("param_names" in g for g in self.optimizer.param_groups)

    def detach(self, params: Sequence[nn.Parameter]) -> None:
        """Take ``params`` out of whatever groups hold them, keeping their state."""
        ids = {id(p) for p in params}
        for group in self.optimizer.param_groups:
            keep = [i for i, p in enumerate(group["params"]) if id(p) not in ids]
            if len(keep) == len(group["params"]):
                continue
            if "param_names" in group:
                group["param_names"] = [group["param_names"][i] for i in keep]
            group["params"] = [group["params"][i] for i in keep]

    def remove(self, params: Sequence[nn.Parameter]) -> int:
        """Take ``params`` out of the optimizer and set their state aside on the host.

        Returns the bytes of state freed from the accelerator (0 on the CPU). The state
        comes back, on its original device and bit for bit, when the command is undone.
        """
        self.detach(params)
        state = self.optimizer.state
        stash: list[tuple[nn.Parameter, dict]] = []
        freed = 0
        for p in params:
            if p not in state:  # `state` is a defaultdict: never index it blindly
                continue
            entry = state.pop(p)
            kept = {}
            for key, value in entry.items():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    freed += value.numel() * value.element_size()
                    kept[key] = (value.to("cpu"), value.device)
                else:
                    kept[key] = (value, None)
            stash.append((p, kept))

        def restore_state() -> None:
            for p, kept in stash:
                state[p] = {
                    k: (v.to(dev) if dev is not None else v) for k, (v, dev) in kept.items()
                }

        self._tx.add(restore_state)
        return freed

    def add_group(
        self,
        params: Sequence[nn.Parameter],
        *,
        name: str,
        lr: float,
        template: dict,
        names: Sequence[str] = (),
        weight_decay: float | None = None,
    ) -> int:
        """Put ``params`` in a group called ``name`` at ``lr`` and return its index.

        An existing empty group of that name is reused (freeze/unfreeze cycles do not pile
        up groups); otherwise a new group copies ``template``'s hyper-parameters.
        """
        self.detach(params)
        groups = self.optimizer.param_groups
        for index, group in enumerate(groups):
            if group.get("name") == name and not group["params"]:
                group["params"] = list(params)
                if "param_names" in group:
                    group["param_names"] = list(names)
                group["lr"] = lr
                if weight_decay is not None:
                    group["weight_decay"] = weight_decay
                return index
        new = {
            k: v for k, v in template.items() if k not in SCHEDULE_KEYS and k not in _IDENTITY_KEYS
        }
        new["params"] = (
            list(zip(names, params, strict=True)) if self.uses_param_names else list(params)
        )
        new.update(lr=lr, name=name)
        if weight_decay is not None:
            new["weight_decay"] = weight_decay
        self.optimizer.add_param_group(new)
        return len(groups) - 1

    def set_params(self, index: int, params: Sequence[nn.Parameter], names: Sequence[str]) -> None:
        """Make group ``index`` hold exactly ``params`` (a replaced head reusing its group)."""
        group = self.optimizer.param_groups[index]
        group["params"] = list(params)
        if "param_names" in group:
            group["param_names"] = list(names)
