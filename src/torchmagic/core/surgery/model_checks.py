"""Models and optimizers surgery cannot edit safely, refused before anything changes, each
with one line that names the fix.

- Lazy modules (``nn.LazyLinear`` …) before their first forward: their parameters have
  no shape yet, so nothing can be counted, frozen into a group or replaced.
- TorchScript modules (``torch.jit.script``): their submodules and attributes are
  compiled, not the Python objects surgery swaps.
- Optimizers that cache a flat view of their parameters: ``torch.optim.LBFGS`` (one
  group whose list it keeps as ``_params``, sizes in ``_numel_cache``) and
  ``ZeroRedundancyOptimizer`` (per-rank partitions of the groups) would go on stepping
  the parameters they held when built.
- An optimizer stepping a base optimizer (timm's ``Lookahead``) whose ``param_groups``
  are no longer the base's list: an edit of one would not reach the other.
- Optimizers that take some parameters only: ``torch.optim.Muon`` (2-D matrices) and
  ``SparseAdam`` (sparse gradients: embeddings built with ``sparse=True``). A parameter
  outside the rule would make the next step raise, so it never enters them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import is_lazy

from ..errors import TorchMagicError
from ..integrations.lookup import state_holder
from ..modules import ModelWalk, walk

# Optimizer classes (by name, so that optional packages need not be imported) that keep
# their own view of the groups' members, which an in-place group edit would not reach.
CACHED_VIEW_OPTIMIZERS = {
    "LBFGS": "keeps one flat view of its single param group (_params, _numel_cache)",
    "ZeroRedundancyOptimizer": "partitions its param groups across ranks once",
}


def lazy_modules(modules: Sequence[tuple[str, nn.Module]]) -> list[str]:
    """Qualified names of the ``modules`` (a model's, by name) whose parameters or buffers
    are still lazy."""
    if not any(isinstance(m, LazyModuleMixin) for _, m in modules):  # the cheap common case
        return []
    return [
        f"{name or 'the model'}: {type(module).__name__}"
        for name, module in modules
        if any(
            t is not None and is_lazy(t)
            for t in (*module._parameters.values(), *module._buffers.values())
        )
    ]


def check_readable(model_name: str, walked: ModelWalk) -> None:
    """Refuse a model whose parameters cannot be counted yet (lazy modules); ``walked``:
    its walk."""
    lazy = lazy_modules(walked.modules)
    if lazy:
        shown = ", ".join(lazy[:4]) + (", …" if len(lazy) > 4 else "")
        raise TorchMagicError(
            f"'{model_name}' has lazy modules not initialised yet ({shown}): run one batch "
            f"through it first, e.g. {model_name}(inputs)"
        )


def check_editable(model: nn.Module, model_name: str, walked: ModelWalk) -> None:
    """Refuse a model surgery cannot edit: TorchScript, or not readable (``walked``: its
    walk)."""
    if isinstance(model, torch.jit.ScriptModule):
        raise TorchMagicError(
            f"'{model_name}' is a TorchScript module (torch.jit.script): edit the Python "
            "model, then script it again"
        )
    check_readable(model_name, walked)


def _sparse_embedding_parameters(model: nn.Module) -> set[int]:
    return {
        id(p)
        for m in walk(model)
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
        for p in m.parameters(recurse=False)
    }


def check_takes(
    optimizer: torch.optim.Optimizer,
    params: Sequence[nn.Parameter],
    model: nn.Module,
    names: Callable[[Sequence[nn.Parameter]], list[str]],
) -> None:
    """Refuse ``params`` that ``optimizer``'s own rule does not take (Muon: 2-D only;
    SparseAdam: sparse gradients only), naming them and the way on."""
    kinds = {cls.__name__ for cls in type(optimizer).__mro__}
    if "Muon" in kinds:
        odd, rule = [p for p in params if p.dim() != 2], "takes 2-D parameters only"
    elif "SparseAdam" in kinds:
        sparse = _sparse_embedding_parameters(model)
        odd, rule = [p for p in params if id(p) not in sparse], "takes sparse gradients only"
    else:
        return
    if odd:
        shown = ", ".join(names(odd[:3])) + (", …" if len(odd) > 3 else "")
        raise TorchMagicError(
            f"{type(optimizer).__name__} {rule}, and {len(odd)} of these parameters would "
            f"enter it ({shown}): give them to another optimizer with optimizer=NAME, or "
            "select only what it takes"
        )


def check_lr(optimizer: torch.optim.Optimizer, lr: object) -> None:
    """Refuse what needs a group's lr when the optimizer sets its own (transformers'
    ``Adafactor(lr=None, relative_step=True)``: each lr comes from the step count)."""
    if lr is None:
        raise TorchMagicError(
            f"{type(optimizer).__name__} computes its own lr (relative_step=True, lr=None), "
            "so there is no lr to set or follow: drop lr=, or build it with an lr "
            "(lr=1e-3, relative_step=False) to set lrs per group"
        )


def check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Refuse to change the param groups of an optimizer that caches a view of them, or
    of one stepping a base optimizer (timm's ``Lookahead``) whose groups are no longer
    the base's: the edit would miss the groups the base steps."""
    for cls in type(optimizer).__mro__:
        reason = CACHED_VIEW_OPTIMIZERS.get(cls.__name__)
        if reason is not None:
            raise TorchMagicError(
                f"{type(optimizer).__name__} {reason}: torchmagic cannot change which "
                "parameters it trains; do the surgery first, then create the optimizer"
            )
    base = state_holder(optimizer)
    if base is not optimizer and base.param_groups is not optimizer.param_groups:
        kind = type(optimizer).__name__
        raise TorchMagicError(
            f"this {kind} no longer shares its base {type(base).__name__}'s param_groups "
            f"(the base's load_state_dict was called, not the {kind}'s): call "
            f"load_state_dict(state_dict()) on the {kind} to join them again, then retry"
        )
