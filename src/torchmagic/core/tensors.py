"""Walking tensors, shared by every domain: byte counts (each tensor once), tensors nested
in lists / tuples / dicts / plain attributes, optimizer state with the device it belongs
on, and which optimizers hold a model's parameters.

Everything compares tensors by identity: a tied weight is one object and counts once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, TypeVar

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .integrations.lookup import state_of

Named = TypeVar("Named")

# -- bytes ---------------------------------------------------------------------------


def nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements; 0 for a lazy module's parameter not yet materialised."""
    return 0 if is_lazy(t) else t.numel() * t.element_size()


def unique(tensors: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """Each tensor once (by identity: a tied parameter is one object), in order."""
    seen: set[int] = set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield t


def total_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors, each counted once."""
    return sum(nbytes(t) for t in unique(tensors))


# -- nested containers ---------------------------------------------------------------


def _leaves(
    value: object,
    path: str | None,
    depth: int | None,
    kind: type | tuple[type, ...],
    max_items: int | None,
    newest: bool,
) -> Iterator[tuple[str | None, Any]]:
    if isinstance(value, (list, tuple, dict)) and depth != 0:
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        if max_items is not None and len(items) > max_items:
            if not newest:
                return
            items = items[-max_items:]
        inner = None if depth is None else depth - 1
        dict_keys = isinstance(value, dict)
        for key, item in items:
            item_path = None
            if path is not None:
                item_path = f"{path}[{key!r}]" if dict_keys else f"{path}[{key}]"
            yield from _leaves(item, item_path, inner, kind, max_items, newest)
    elif isinstance(value, kind):
        yield path, value


def leaves(
    value: object,
    *,
    depth: int | None = None,
    kind: type | tuple[type, ...] = torch.Tensor,
    max_items: int | None = None,
    newest: bool = False,
) -> Iterator[Any]:
    """The ``kind`` objects in ``value``: itself, or inside lists, tuples and dicts.

    ``depth`` bounds how many containers deep the walk goes (None: all the way; 0: only
    ``value`` itself). A container longer than ``max_items`` is skipped (a dataset kept on
    a module), or with ``newest`` cut to its last ``max_items`` entries (a leak appends).
    """
    return (v for _, v in _leaves(value, None, depth, kind, max_items, newest))


def named_leaves(
    value: object,
    path: str,
    *,
    depth: int | None = None,
    kind: type | tuple[type, ...] = torch.Tensor,
    max_items: int | None = None,
) -> Iterator[tuple[str, Any]]:
    """:func:`leaves` with where each was found: ``path[2]``, ``path['key'][0]``."""
    for where, v in _leaves(value, path, depth, kind, max_items, False):
        yield str(where), v


def attribute_tensors(
    model: nn.Module, *, depth: int, max_items: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors a module tree keeps outside ``_parameters`` / ``_buffers`` (``.to()`` skips
    them), alone or nested in plain attributes, by qualified name.

    Attributes that merely alias a registered tensor (RNN's ``_flat_weights``) are skipped.
    """
    registered = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in ("_parameters", "_buffers", "_modules") or isinstance(value, nn.Module):
                continue
            qualified = f"{prefix}.{attr}" if prefix else attr
            for name, tensor in named_leaves(value, qualified, depth=depth, max_items=max_items):
                if id(tensor) not in registered:
                    yield name, tensor


# -- optimizer state -----------------------------------------------------------------


def step_stays_on_host(group: dict, key: str) -> bool:
    """Optimizers keep ``step`` on the CPU unless the group is capturable or fused."""
    return key == "step" and not (group.get("capturable") or group.get("fused"))


class StateTensor(NamedTuple):
    """One tensor of an optimizer's state, with the parameter and group it belongs to."""

    group_index: int
    param_index: int  # position in the group's ``params``
    group: dict
    param: nn.Parameter
    key: str  # "exp_avg", "step", …
    value: torch.Tensor

    @property
    def follows_param(self) -> bool:
        """Whether this tensor belongs on its parameter's device (``step`` may not)."""
        return not step_stays_on_host(self.group, self.key)

    @property
    def misplaced(self) -> bool:
        """Belongs with its parameter but sits on another device."""
        return self.follows_param and self.value.device != self.param.device


def state_entries(optimizer: torch.optim.Optimizer) -> Iterator[StateTensor]:
    """Every state tensor of the parameters in the optimizer's groups, in group order
    (``optimizer.state`` is a defaultdict: it is read with ``.get``, never indexed)."""
    state = state_of(optimizer)
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            for key, value in (state.get(p) or {}).items():
                if isinstance(value, torch.Tensor):
                    yield StateTensor(gi, pi, group, p, key, value)


def state_tensors(
    optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor] | None = None
) -> Iterator[torch.Tensor]:
    """Tensors in the optimizer's state (of ``params`` only, when given), each once;
    also the state of parameters no group holds any more."""
    state = state_of(optimizer)
    entries = (
        state.values() if params is None else (s for p in params if (s := state.get(p)) is not None)
    )
    return unique(v for s in entries for v in s.values() if isinstance(v, torch.Tensor))


def state_bytes(
    optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor] | None = None
) -> int:
    """Bytes of the optimizer's state (of ``params`` only, when given)."""
    return sum(nbytes(t) for t in state_tensors(optimizer, params))


# -- who holds what ------------------------------------------------------------------


def optimizer_params(optimizer: torch.optim.Optimizer) -> Iterator[nn.Parameter]:
    """Every parameter in the optimizer's groups, in group order."""
    for group in optimizer.param_groups:
        yield from group["params"]


def held_ids(optimizers: Iterable[torch.optim.Optimizer]) -> set[int]:
    """``id`` of every parameter the optimizers hold."""
    return {id(p) for o in optimizers for p in optimizer_params(o)}


def owners(
    named: Iterable[tuple[Named, torch.optim.Optimizer]], params: Iterable[torch.Tensor]
) -> list[tuple[Named, torch.optim.Optimizer]]:
    """The (name, optimizer) pairs holding at least one of ``params``, by identity."""
    ids = {id(p) for p in params}
    return [(n, o) for n, o in named if any(id(p) in ids for p in optimizer_params(o))]
