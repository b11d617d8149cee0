"""The models a Session works on: one built from the zoo by name and bound in the
namespace with its weights, transforms and labels, its head replaced as a command."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..surgery.results import Change
from ..zoo import LoadedModel, check_binding
from ..zoo import load_model as build_model

if TYPE_CHECKING:
    from .facade import Session


def load_model(
    session: Session,
    name: str,
    weights: str | None,
    num_classes: int | None,
    bind: str,
    head_command: str | None,
) -> tuple[LoadedModel, Change | None]:
    check_binding(bind, session.workspace.namespace)
    loaded = build_model(name, weights)
    before = _bindings(session, bind)
    try:
        return _bind(session, loaded, bind, num_classes, head_command)
    except BaseException:  # a refused head (or Ctrl-C): nothing stays bound
        _restore(session, bind, before)
        raise


_NAMES = ("weights", "preprocess", "categories")
_UNBOUND = object()


def _bindings(session: Session, bind: str) -> tuple[dict[str, object], object, str | None]:
    namespace = session.workspace.namespace
    held = {n: namespace.get(n, _UNBOUND) for n in (bind, *_NAMES)}
    return held, session.loaded.get(bind, _UNBOUND), session.workspace.current


def _restore(
    session: Session, bind: str, before: tuple[dict[str, object], object, str | None]
) -> None:
    held, loaded, current = before
    namespace = session.workspace.namespace
    for name, value in held.items():
        if value is _UNBOUND:
            namespace.pop(name, None)
        else:
            namespace[name] = value
    if loaded is _UNBOUND:
        session.loaded.pop(bind, None)
    else:
        session.loaded[bind] = loaded  # type: ignore[assignment]
    session.workspace.current = current


def _bind(
    session: Session,
    loaded: LoadedModel,
    bind: str,
    num_classes: int | None,
    head_command: str | None,
) -> tuple[LoadedModel, Change | None]:
    namespace = session.workspace.namespace
    namespace[bind] = loaded.model
    namespace["weights"] = loaded.weights
    namespace["preprocess"] = loaded.preprocess
    namespace["categories"] = list(loaded.categories) if loaded.categories else None
    session.loaded[bind] = loaded
    session.workspace.current = bind
    if num_classes is None:
        return loaded, None
    return loaded, session.replace_head(bind, num_classes, command=head_command)
