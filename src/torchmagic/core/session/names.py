"""What a Session call names, resolved to live objects: the model with its optimizer and
schedulers, the modules a target selects, the one module a path names, variables and
loaders. Resolving binds nothing: one walk of the namespace serves a whole call."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import TorchMagicError
from ..integrations import discovery
from ..modules import ModelWalk, unwrap, walk_model
from ..surgery import edits, model_checks
from ..surgery.grammar import Target, parse_targets, suffix_list
from ..surgery.selection import Selection, resolve, select
from ..workspace import StaleOptimizerError, Workspace


def namespace_of(
    model: nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    schedulers: Sequence[object],
    namespace: MutableMapping | None,
) -> MutableMapping:
    """The namespace a Session finds its objects in: the one given (a notebook's), else
    a script's own holding ``model``, ``optimizer`` and ``schedulers``."""
    if namespace is not None:
        return namespace
    own: MutableMapping = {"schedulers": list(schedulers)}
    if model is not None:
        own["model"] = model
    if optimizer is not None:
        own["optimizer"] = optimizer
    return own


def bind(
    workspace: Workspace,
    name: str,
    model: nn.Module,
    optimizer: str | None,
    reading: bool,
    *,
    walked: ModelWalk | None = None,
    acting_on: Callable[[], Sequence[nn.Parameter]] | None = None,
) -> edits.BoundModel:
    """``model`` with its optimizer and schedulers, walked once (the walk every step of
    the command reads), and the other optimizers holding its parameters. An optimizer
    holding none of its parameters is refused; ``reading`` (commands that only show)
    treats it as none. ``walked``: the model's walk when the caller has made it;
    ``acting_on``: the parameters the command edits (they choose among several
    optimizers, see ``Workspace.resolve_optimizer``)."""
    with workspace.pinned():
        real = unwrap(model)
        walked = walk_model(real) if walked is None else walked
        try:
            opt_name, opt = workspace.resolve_optimizer(
                name,
                real,
                optimizer,
                parameters=walked.parameters,
                acting_on=acting_on,
            )
        except StaleOptimizerError:
            if not reading:
                raise
            opt_name, opt = None, None
        copies, unclear = workspace.ema_copies(real)
        found = workspace.found()
        others = [] if reading else other_optimizers(workspace, found, name, real, walked, opt)
        return edits.BoundModel(
            real,
            name,
            walked,
            opt,
            opt_name,
            workspace.schedulers(opt) if opt is not None else [],
            names=workspace.names(),
            rebuilt=None if opt_name is None else workspace.rebuilt(opt_name),
            ema_copies=copies,
            ema_unclear=unclear,
            holders=discovery.holders(found, real, name, opt, opt_name),
            others=others,
            named=optimizer is not None,
        )


def other_optimizers(
    workspace: Workspace,
    found: list,
    name: str,
    model: nn.Module,
    walked: ModelWalk,
    opt: torch.optim.Optimizer | None,
) -> list[edits.OtherOptimizer]:
    """The optimizers other than ``opt`` holding ``model``'s parameters or their homes."""
    return [
        edits.OtherOptimizer(
            other_name,
            other,
            workspace.schedulers(other),
            workspace.rebuilt(other_name),
            discovery.holders(found, model, name, other, other_name),
        )
        for other_name, other in workspace.holding(walked.parameters)
        if opt is None or other.param_groups is not opt.param_groups  # not opt, nor its base
    ]


def bound(
    workspace: Workspace, model: str | None, optimizer: str | None, reading: bool
) -> edits.BoundModel:
    """The named (or current) model, bound (see :func:`bind`)."""
    with workspace.pinned():
        name, module = workspace.resolve_model(model)
        return bind(workspace, name, module, optimizer, reading)


@dataclass(frozen=True)
class Selected:
    """What a command's targets name, parsed and resolved once: the model, bound, the
    blocks selected in it, and the targets and exclusions as text relative to the model
    (what its replay record holds, so that it replays under any variable name)."""

    target: edits.BoundModel
    selection: Selection
    relative: tuple[str, ...]
    excluded: tuple[str, ...]


def selection(
    workspace: Workspace,
    targets: Sequence[str],
    exclude: Sequence[str],
    optimizer: str | None,
    suffixes: bool = False,
) -> Selected:
    """The model ``targets`` name, bound, and the blocks they select in it (less
    ``exclude``); refuses models surgery cannot edit. ``suffixes``: names that are no
    path name the modules whose paths end so (peft's habit)."""
    with workspace.pinned():
        parsed = parse_targets(targets) if targets else ()
        excluded = parse_targets(exclude)
        name, model, relative = workspace.split_root(parsed)
        real = unwrap(model)
        walked = walk_model(real)
        model_checks.check_editable(real, name, walked)
        relative_excluded = [workspace.relative_to(name, t) for t in excluded]
        chosen = select(real, relative, relative_excluded, suffixes, walked)
        target = bind(
            workspace, name, real, optimizer, False, walked=walked, acting_on=chosen.parameters
        )
        return Selected(
            target,
            chosen,
            tuple(_relative_text(t) for t in relative),
            tuple(_relative_text(t) for t in relative_excluded),
        )


def _relative_text(target: Target) -> str:
    """A target relative to its model, as text the grammar parses again ("" : the model)."""
    if target.glob is not None:
        return target.glob
    if target.suffixes:
        return suffix_list(target.suffixes)
    return ".".join(segment.text for segment in target.segments)


def one_module(
    workspace: Workspace,
    where: str | None,
    optimizer: str | None = None,
    reading: bool = False,
    acting_on: Callable[[nn.Module, str, ModelWalk], Sequence[nn.Parameter]] | None = None,
) -> tuple[edits.BoundModel, str, nn.Module]:
    """The model ``where`` names (or the current one) and the one module inside it
    that ``where``'s path names: (bound model, relative name, module). ``reading``:
    refuse only models surgery cannot read, else those it cannot edit. ``acting_on``:
    the parameters the command edits, given the model, the module's name and the walk
    (see :func:`bind`)."""
    with workspace.pinned():
        if where is None:
            name, model = workspace.resolve_model()
            relative = None
        else:
            name, model, relative_targets = workspace.split_root(parse_targets([where]))
            relative = relative_targets[0]
        real = unwrap(model)
        walked = walk_model(real)
        if reading:
            model_checks.check_readable(name, walked)
        else:
            model_checks.check_editable(real, name, walked)
        module_name, module = "", real
        if relative is not None and not relative.is_whole:
            hits = resolve(real, relative, walked=walked)
            if len(hits) != 1:
                raise TorchMagicError(
                    f"'{where}' names {len(hits)} modules; name one", param="where"
                )
            module_name, module = hits[0]
        edited = None if acting_on is None else lambda: acting_on(real, module_name, walked)
        target = bind(workspace, name, real, optimizer, reading, walked=walked, acting_on=edited)
        return target, module_name, module


def variable(workspace: Workspace, value: object, param: str) -> object:
    """``value``, or the object bound to it when it is a variable name."""
    if not isinstance(value, str):
        return value
    if value not in workspace.namespace:
        names = [name for name, _ in workspace.items()]
        close = difflib.get_close_matches(value, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise TorchMagicError(f"no variable named '{value}' for {param}{hint}", param=param)
    return workspace.namespace[value]


def loader(workspace: Workspace, value: object, param: str) -> Iterable:
    """The batches ``value`` is (or names): anything iterable."""
    value = variable(workspace, value, param)
    if not isinstance(value, Iterable):
        raise TorchMagicError(
            f"{param} must be an iterable of batches, got {type(value).__name__}",
            param=param,
        )
    return value


def name_of(workspace: Workspace, value: object, default: str) -> str:
    """The variable ``value`` is bound to (itself when it is a name), else ``default``."""
    if isinstance(value, str):
        return value
    return next((n for n, v in workspace.items() if v is value), default)
