"""Which transforms a prediction uses: the evaluation ones, never the training
augmentation. In order: the caller's, the weights' ``transforms()`` the model was loaded
with, else the transform of the loaders in the namespace that do not augment (one of them,
or several that are the same object). A namespace whose loaders all augment is refused in
one line naming ``transforms=``: a random crop or flip at prediction time changes the
answer from call to call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch.utils.data import DataLoader

from ..errors import TorchMagicError
from ..training.data import base_dataset, random_transforms


def eval_transforms(
    given: Callable | None,
    preset: Callable | None,
    loaders: Sequence[tuple[str, object]],
) -> Callable | None:
    """The transforms for prediction, or None when nothing is known (tensors need none)."""
    if given is not None:
        if not callable(given):
            raise TorchMagicError(
                f"transforms must be callable, got a {type(given).__name__}", param="transforms"
            )
        return given
    if preset is not None:
        return preset
    plain: dict[int, tuple[str, Callable]] = {}
    augmenting: list[tuple[str, list[str]]] = []
    for name, loader in loaders:
        if not isinstance(loader, DataLoader):
            continue
        transform = getattr(base_dataset(loader.dataset), "transform", None)
        if transform is None:
            continue
        randoms = random_transforms(loader.dataset)
        if randoms:
            augmenting.append((name, randoms))
        else:
            plain.setdefault(id(transform), (name, transform))
    if len(plain) == 1:
        return next(iter(plain.values()))[1]
    if len(plain) > 1:
        names = ", ".join(name for name, _ in plain.values())
        raise TorchMagicError(
            f"the loaders {names} have different transforms: give transforms= to choose",
            param="transforms",
        )
    if augmenting:
        name, randoms = augmenting[0]
        raise TorchMagicError(
            f"only augmenting transforms are known ({name}: {', '.join(randoms)}); "
            "give the evaluation transforms with transforms=",
            param="transforms",
        )
    return None
