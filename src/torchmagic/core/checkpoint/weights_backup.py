"""The model's weights backed up while a load fills them, so a failed load is put back by
a pointer swap instead of a copy of every weight kept beforehand."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

_PLAIN = (torch.Tensor, nn.Parameter)


def _loads_whole_tensors(model: nn.Module) -> bool:
    """Every module loads its state with torch.nn's own ``_load_from_state_dict``, which
    copies each tensor whole (a module's own loader may write a part, or elsewhere)."""
    return all(
        type(m)._load_from_state_dict.__module__.startswith("torch.nn.") for m in model.modules()
    )


def _swappable(model: nn.Module) -> list[torch.Tensor] | None:
    """The tensors of ``model``'s state_dict, each once, when every one can be given new
    memory safely: a plain parameter or buffer of the model alone in its storage, which a
    torch.nn loader fills whole; None otherwise."""
    own = {id(t) for t in (*model.parameters(), *model.buffers())}
    tensors = list({id(v): v for v in model.state_dict(keep_vars=True).values()}.values())
    storages = set()
    for t in tensors:
        if type(t) not in _PLAIN or id(t) not in own:
            return None
        storage = t.untyped_storage()
        if storage.nbytes() != t.nbytes or storage.data_ptr() in storages:
            return None  # a view, or memory shared with another tensor: both stay as they are
        storages.add(storage.data_ptr())
    return tensors if _loads_whole_tensors(model) else None


def back_up_weights(model: nn.Module) -> Callable[[], None]:
    """Give every tensor of ``model``'s state_dict new memory of its own layout for the load
    to fill, the old memory kept untouched; returns the put-back, which gives each tensor
    its old memory again (the same Parameter objects, so an optimizer keeps them). Where a
    tensor cannot be swapped so (a view, shared memory, a module's own loader), the weights
    are copied instead and the put-back loads the copy."""
    tensors = _swappable(model)
    if tensors is None:
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def load_copy() -> None:
            model.load_state_dict(weights, strict=True)

        return load_copy
    kept = [(t, t.data) for t in tensors]

    def put_back() -> None:
        for t, old in kept:
            t.data = old

    try:
        for t, _ in kept:
            t.data = torch.empty_like(t)
        return put_back
    except BaseException:
        put_back()
        raise
