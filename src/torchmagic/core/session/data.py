"""Your own images for a model: loaders whose transforms match the weights the model
was loaded with, bound in the namespace, and the folder's classes kept as the model's
class names (so a head can be sized and labelled from them)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..data import ImageFolders, image_folders
from ..errors import TorchMagicError
from ..modules import unwrap

if TYPE_CHECKING:
    from .facade import Session


def _check_names(names: tuple[str, str], namespace: Any) -> None:
    from torch.utils.data import DataLoader

    if len(names) != 2 or len(set(names)) != 2:
        raise TorchMagicError(
            f"two different variable names for the training and the validation loader, "
            f"got {', '.join(names) or 'none'}",
            param="bind",
        )
    for name in names:
        if not name.isidentifier() or name.startswith("__"):
            raise TorchMagicError(
                f"cannot bind a loader to {name!r}: not a variable name", param="bind"
            )
        held = namespace.get(name)
        if held is not None and not isinstance(held, DataLoader):
            raise TorchMagicError(
                f"cannot bind a loader to '{name}': it holds a {type(held).__name__}; "
                "choose another name",
                param="bind",
            )


def _model_name(session: Session, model: str | None) -> str | None:
    """The model the data is for: the named one, else the current one; None when the
    namespace holds no model at all."""
    if model is None and not session.workspace.models():
        return None
    return session.workspace.resolve_model(model)[0]


def load_data(
    session: Session,
    path: str | os.PathLike,
    model: str | None,
    bind: tuple[str, str],
    options: dict[str, Any],
) -> ImageFolders:
    namespace = session.workspace.namespace
    _check_names(bind, namespace)
    name = _model_name(session, model)
    loaded = session.loaded.get(name) if name is not None else None
    found = image_folders(
        path, loaded if loaded is not None and loaded.weights else None, **options
    )
    namespace[bind[0]], namespace[bind[1]] = found.train_loader, found.val_loader
    if name is not None:
        module = unwrap(session.workspace.resolve_model(name)[1])
        session.class_names.keep(module, found.classes)
        session.pipelines[module] = found.pipelines
    return replace(found, bound=bind, model=name)
