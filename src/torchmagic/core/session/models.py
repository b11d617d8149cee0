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
