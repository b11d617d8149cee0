"""Completion candidates from the live namespace: module paths in the target grammar
(``layer1``, ``layer1-3``, ``model.features.0-6``), variables of one kind (models,
optimizers, loaders of batches, losses), the zoo's model and weights names, and the
files a save, load or export names.

Runs on every TAB, so it only reads: no forward pass, no copies, no iteration over a
loader, and at most ``limit`` answers. Text that does not parse yet yields nothing,
never an error. Each candidate knows its kind (a model, a block, a loader…), which a
front end shows beside it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import types
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from itertools import islice

import torch
from torch import nn
from torch.utils.data import DataLoader

from .devices.estimate import RULES
from .errors import TorchMagicError
from .surgery.grammar import parse_target
from .surgery.selection import resolve
from .training.data import split_batch
from .training.fit_plan import LOSSES, resolve_loss
from .workspace import Workspace
from .zoo import SOURCES

LIMIT = 200
# A range being typed: `layer1-`, `layer1-1` (towards layer1-12), `0-` on a Sequential.
_PARTIAL_RANGE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*?)?(\d+)-(\d*)$")
_GLOB_OR_QUOTE = frozenset("*?[\"'")


class Candidate(str):
    """A completion: its text, and what it names (``kind``: "model", "block", "loader",
    "optimizer", "loss", "class", "device", "weights"…)."""

    kind: str

    def __new__(cls, text: str, kind: str) -> Candidate:
        made = super().__new__(cls, text)
        made.kind = kind
        return made


def tagged(texts: Iterable[str], kind: str) -> list[Candidate]:
    return [Candidate(text, kind) for text in texts]


def _children(modules: list[nn.Module]) -> list[str]:
    """Child names every module has (a range's blocks share their layout), in the first
    one's registration order."""
    first, *others = modules
    return [
        name
        for name, child in first._modules.items()
        if child is not None and all(other._modules.get(name) is not None for other in others)
    ]


def module_paths(model: nn.Module, typed: str, limit: int = LIMIT) -> list[str]:
    """Paths inside ``model`` that complete ``typed`` (relative to it), in registration
    order: the children of the part before the last dot that start with the last part,
    or, after ``name<N>-``, the numbered siblings above N (``layer1-`` → ``layer1-2``…)."""
    if any(c in _GLOB_OR_QUOTE for c in typed):
        return []
    parent_text, dot, last = typed.rpartition(".")
    if dot and not parent_text:
        return []
    try:
        parents = [m for _, m in resolve(model, parse_target(parent_text))] if dot else [model]
    except TorchMagicError:
        return []
    names = _children(parents)
    stem = parent_text + dot
    found: Iterator[str]
    partial = _PARTIAL_RANGE.match(last)
    if partial and f"{partial.group(1) or ''}{partial.group(2)}" in names:
        prefix, start, stop = partial.group(1) or "", int(partial.group(2)), partial.group(3)
        numbers = (name[len(prefix) :] for name in names if name.startswith(prefix))
        found = (
            f"{stem}{prefix}{start}-{n}"
            for n in numbers
            if n.isdigit() and int(n) > start and n.startswith(stop)
        )
    else:
        found = (stem + name for name in names if name.startswith(last))
    return list(islice(found, limit))


def target_candidates(
    workspace: Workspace, typed: str, root: str | None = None, limit: int = LIMIT
) -> list[Candidate]:
    """Completions of one target as a magic reads it: the first dotted part names a model
    variable (``model.la`` → ``model.layer1``…) or a child of the current model (or of
    ``root``, the model the command already names), as in :meth:`Workspace.split_root`."""
    head, dot, rest = typed.partition(".")
    if dot:
        named = workspace.module(head)
        if named is not None and (root is None or head == root):
            return tagged((f"{head}.{path}" for path in module_paths(named, rest, limit)), "block")
    try:
        _, model = workspace.resolve_model(root)
    except TorchMagicError:  # no model, or several and none current: names only
        model = None
    names = [root] if root is not None else _models(workspace)
    found = tagged((name for name in names if not dot and name.startswith(typed)), "model")
    if model is not None:
        found += tagged(module_paths(model, typed, limit), "block")
    return found[:limit]


def _models(workspace: Workspace) -> list[str]:
    """The workspace's models that have parameters: not a loss or an activation."""
    return [n for n, m in workspace.models().items() if next(m.parameters(), None) is not None]


def is_loader(value: object) -> bool:
    """A DataLoader, another ``…Loader`` class, or a list / tuple whose first item is an
    (inputs, targets) batch: judged without iterating."""
    if isinstance(value, DataLoader):
        return True
    if isinstance(value, (list, tuple)):
        if not value:
            return False
        try:
            split_batch(value[0])
        except TorchMagicError:
            return False
        return True
    if isinstance(value, (nn.Module, torch.Tensor, Mapping, type, types.ModuleType)):
        return False
    kind = type(value)
    return hasattr(kind, "__iter__") and kind.__name__.endswith("Loader")


def _is_loss(name: str, value: object, namespace: Mapping[str, object]) -> bool:
    if not callable(value) or isinstance(value, type):
        return False
    if isinstance(value, nn.Module) and next(value.parameters(), None) is not None:
        return False  # a model, not a loss
    try:
        resolve_loss(name, namespace)
    except TorchMagicError:
        return False
    return True


def variables(workspace: Workspace, kind: str, typed: str, limit: int = LIMIT) -> list[Candidate]:
    """User variables of ``kind`` whose names start with ``typed``: ``"model"`` (models
    with parameters, not part of another bound model), ``"optimizer"``, ``"loader"`` (see
    :func:`is_loader`), ``"loss"`` (the built-in names, then callables the loss
    argument accepts) or ``"optimizer_class"`` (the optimizers an estimate knows)."""
    if kind == "model":
        names = _models(workspace)
    elif kind == "optimizer":
        names = [name for name, _ in workspace.optimizers()]
    elif kind == "loader":
        names = [name for name, value in workspace.items() if is_loader(value)]
    elif kind == "loss":
        namespace = workspace.namespace
        names = list(LOSSES) + [
            name for name, value in workspace.items() if _is_loss(name, value, namespace)
        ]
    elif kind == "optimizer_class":
        names = sorted(RULES)
    else:
        raise ValueError(f"unknown kind of variable {kind!r}")
    shown = "class" if kind == "optimizer_class" else kind
    return tagged([name for name in names if name.startswith(typed)][:limit], shown)


def cuda_devices() -> list[Candidate]:
    """``cuda`` and ``cuda:N`` for each visible device; counting them does not
    initialise CUDA."""
    count = torch.cuda.device_count()
    return tagged(["cuda", *(f"cuda:{i}" for i in range(count))] if count else [], "device")


@cache
def _torchvision_models() -> tuple[str, ...]:
    from torchvision import models

    return tuple(models.list_models())


@cache
def _timm_models() -> tuple[str, ...]:
    import timm

    return tuple(timm.list_models())


def zoo_models(typed: str, limit: int = LIMIT) -> list[Candidate]:
    """Model names ``load_model`` builds that start with ``typed``: torchvision's, timm's
    after ``timm:`` (and bare, once timm is imported: importing it takes seconds, too long
    for a TAB), and the source prefixes themselves. The lists are read once."""
    source, colon, rest = typed.partition(":")
    if colon:
        if source != "timm" or importlib.util.find_spec("timm") is None:
            return []
        return tagged(
            islice((f"timm:{n}" for n in _timm_models() if n.startswith(rest)), limit), "model"
        )
    names: Iterable[str] = _torchvision_models()
    if "timm" in sys.modules:
        torchvision = set(names)
        names = [*names, *(n for n in _timm_models() if n not in torchvision)]
    prefixes = [f"{s}:" for s in SOURCES if s != "torchvision" and f"{s}:".startswith(typed)]
    found = tagged(prefixes, "source") + tagged((n for n in names if n.startswith(typed)), "model")
    return found[:limit]


def zoo_weights(model_name: str, typed: str) -> list[Candidate]:
    """The weights ``load_model`` takes for ``model_name``: DEFAULT, none, and a torchvision
    model's named sets (IMAGENET1K_V2…)."""
    names = ["DEFAULT", "none"]
    if model_name in _torchvision_models():
        from torchvision import models

        names += [m for m in models.get_model_weights(model_name).__members__ if m != "DEFAULT"]
    return tagged((n for n in names if n.startswith(typed)), "weights")


def paths(typed: str, suffixes: tuple[str, ...] = (), limit: int = LIMIT) -> list[Candidate]:
    """Files and folders that complete ``typed`` (``~`` expanded in the listing, kept in
    the text): folders first, with a ``/``; files only those ending in one of
    ``suffixes`` when given. Lists one folder, never walks a tree."""
    folder, slash, start = typed.rpartition("/")
    where = os.path.expanduser(folder + slash) if slash else "."
    try:
        with os.scandir(where) as entries:
            listed = sorted((e.name, e.is_dir()) for e in entries if e.name.startswith(start))
    except OSError:
        return []
    hidden = not start.startswith(".")
    shown = [(n, d) for n, d in listed if not (hidden and n.startswith("."))]
    stem = folder + slash
    folders = tagged((f"{stem}{n}/" for n, d in shown if d), "folder")
    files = tagged(
        (f"{stem}{n}" for n, d in shown if not d and (not suffixes or n.endswith(suffixes))),
        "file",
    )
    return (folders + files)[:limit]
