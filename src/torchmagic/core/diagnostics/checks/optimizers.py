"""Parameters and the optimizer: tensors that never change, frozen ones that still move,
optimizer state that belongs elsewhere, optimizers of a model that was re-created or whose
head was replaced by hand."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ...advice import PLACEHOLDER, Call
from ...integrations.lookup import state_of
from ...modules import parameter_names
from ...surgery.replaced import Replaced
from ...tensors import held_ids, optimizer_params, state_bytes
from ..context import DoctorContext, ModelEntry
from ..findings import Finding, block_call, first_names
from ..registry import CheckGroup

checks = CheckGroup()


def _recreate(opt_name: str, opt: torch.optim.Optimizer, model_name: str) -> str:
    return f"{opt_name} = torch.optim.{type(opt).__name__}({model_name}.parameters(), lr=…)"


def _replaced_by_hand(model: ModelEntry, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Module path → tensors the optimizer still holds of the module it replaced by
    assignment (``model.fc = nn.Linear(…)``); outermost modules only."""
    found: dict[str, int] = {}
    finder = Replaced(opt, model.module)
    for path, module in model.module.named_modules():
        if not path or any(path.startswith(f"{done}.") for done in found):
            continue
        pairs = finder.predecessors(module)
        if pairs and all(new.requires_grad for _, new in pairs):
            found[path] = len(pairs)
    return found


def _head_by_hand(
    opt_name: str, left: int, model: ModelEntry, opt: torch.optim.Optimizer
) -> Finding | None:
    """The finding for a head assigned by hand, when that is all the stale tensors are."""
    swapped = _replaced_by_hand(model, opt)
    if not swapped or sum(swapped.values()) != left:
        return None
    paths = [f"{model.name}.{p}" for p in swapped]
    return Finding(
        "head-replaced-by-hand",
        "error",
        f"{opt_name}: {', '.join(paths)}",
        f"{', '.join(paths)} was replaced by assignment: {opt_name} still holds the old "
        f"module's {left} tensor(s), and the new one's are in no param group (they get "
        "gradients but never change)",
        (
            Call("unfreeze", tuple(paths)),
            f" puts the new one in the old one's param groups; the old tensors leave with "
            f"their state, the rest of {opt_name}'s state stays",
        ),
    )


@checks.each_optimizer
def stale_optimizer(
    context: DoctorContext, opt_name: str, opt: torch.optim.Optimizer
) -> Iterator[Finding]:
    """An optimizer training a model no variable names: alone (the model was re-created
    after the optimizer) or beside a bound model's tensors (two models in one optimizer).
    The fix is a new optimizer, never adding the new model's parameters to the old one."""
    left = context.orphans.get(opt_name)
    if not left:
        return
    mine = [m.name for m in context.models if (opt_name, opt) in m.optimizers]
    untrained = [m.name for m in context.models if not m.optimizers]
    by_hand = (
        next(
            (m for m in context.models if m.name == mine[0] and (opt_name, opt) in m.optimizers),
            None,
        )
        if mine
        else None
    )
    found = _head_by_hand(opt_name, left, by_hand, opt) if by_hand is not None else None
    if found is not None:
        yield found
        return
    if mine:
        message = (
            f"{opt_name} holds {left} tensor(s) of a model no variable names besides "
            f"those of {', '.join(mine)}: two models in one optimizer (parameters added "
            "to it after the model was re-created)"
        )
        target = mine[0]
    elif untrained:
        message = (
            f"{opt_name} holds {left} tensor(s) of a model no variable names and none of "
            f"{', '.join(untrained)}'s: the model was re-created after {opt_name} (re-running "
            "the model cell makes new parameters), so stepping it trains nothing you hold"
        )
        target = untrained[0]
    else:
        return
    yield Finding(
        "stale-optimizer",
        "error",
        opt_name,
        message,
        f"re-create it: {_recreate(opt_name, opt, target)} (adding {target}'s parameters "
        "to it would mix two models)",
    )


@checks.each_model
def unoptimized(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """Trainable tensors no optimizer of a trained model holds; an optimizer that also
    holds another model's tensors is re-created rather than added to."""
    opts = model.optimizers
    if not opts:
        return
    held = held_ids(o for _, o in opts)
    missing = [
        n for n, p in model.module.named_parameters() if p.requires_grad and id(p) not in held
    ]
    if not missing:
        return
    name = model.name
    opt_names = " / ".join(n for n, _ in opts)
    mixed = [(n, o) for n, o in opts if n in context.orphans]
    swapped = [f"{p}." for n, o in mixed for p in _replaced_by_hand(model, o)]
    if swapped and all(n.startswith(tuple(swapped)) for n in missing):
        return  # a head assigned by hand: stale_optimizer names it, with the fix
    fix = (
        f"re-create {mixed[0][0]} over {name} ({_recreate(*mixed[0], name)}): it also holds "
        "parameters of a model no variable names"
        if mixed
        else (
            block_call("unfreeze", name, missing, lr=PLACEHOLDER),
            f" (adds them to {opts[0][0]} as a param group)",
        )
    )
    yield Finding(
        "unoptimized",
        "error",
        f"{name}: {first_names(missing)}",
        f"{len(missing)} trainable tensor(s) are in no param group of {opt_names}: they get "
        "gradients but never change",
        fix,
    )


@checks.each_model
def frozen_in_optimizer(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """Frozen tensors still in an optimizer: with a .grad they keep moving, with state
    they hold memory for nothing."""
    name = model.name
    names = parameter_names(model.module)
    for opt_name, opt in model.optimizers:
        inside = [p for p in optimizer_params(opt) if id(p) in names and not p.requires_grad]
        graded = [names[id(p)] for p in inside if p.grad is not None]
        if graded:
            yield Finding(
                "frozen-in-optimizer",
                "error",
                f"{name}: {first_names(graded)}",
                f"{len(graded)} frozen tensor(s) in {opt_name} still have a .grad (zeros or "
                "stale): every step applies it, with momentum and weight decay, so they move",
                (
                    block_call("freeze", name, graded),
                    f" (takes them out of {opt_name}), or {opt_name}.zero_grad(set_to_none=True)",
                ),
            )
        stateful = [p for p in inside if state_of(opt).get(p)]
        if stateful:
            yield Finding(
                "frozen-in-optimizer",
                "warning",
                f"{name}: {first_names([names[id(p)] for p in stateful])}",
                f"{len(stateful)} frozen tensor(s) still in {opt_name} hold optimizer state",
                (
                    block_call("freeze", name, [names[id(p)] for p in stateful]),
                    " (frees the state; ",
                    Call("undo"),
                    " brings it back)",
                ),
                state_bytes(opt, stateful),
            )


@checks.each_model
def state_shapes(context: DoctorContext, model: ModelEntry) -> Iterator[Finding]:
    """Optimizer state of another shape than its parameter: an ``optimizer.state_dict()``
    loaded by hand into an optimizer whose groups are in another order (state goes by
    position) put one parameter's moments on another; the next step crashes or, where
    the shapes happen to agree, trains with the wrong state."""
    name = model.name
    names = parameter_names(model.module)
    for opt_name, opt in model.optimizers:
        wrong = [
            names[id(p)]
            for p in optimizer_params(opt)
            if id(p) in names
            and any(
                isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != p.shape
                for v in state_of(opt).get(p, {}).values()
            )
        ]
        if wrong:
            yield Finding(
                "state-shape",
                "error",
                f"{name}: {first_names(wrong)}",
                f"{len(wrong)} tensor(s) in {opt_name} hold optimizer state of another shape "
                "(a state_dict loaded by position into other param groups): the next step "
                "fails or trains with another parameter's state",
                (
                    "save where it trained with ",
                    Call("save", ("PATH",)),
                    f" and continue with torchmagic.resume(PATH, {name}, {opt_name}) (here: ",
                    Call("load", ("PATH",)),
                    f" on a fresh {name} and {opt_name}): states go by parameter name",
                ),
            )
