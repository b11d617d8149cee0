"""What the training loop needs to know about a data loader: how to move its batches, the order its
next epoch will visit, and whether its transforms are random."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from ..errors import TorchMagicError

IGNORE_INDEX = -100  # cross_entropy's default ignore_index: a legal "no label"

# torchvision.transforms (v1 and v2) classes whose output changes from call to call.
_RANDOM_TRANSFORMS = frozenset(
    {
        "ColorJitter",
        "GaussianBlur",
        "GaussianNoise",
        "ElasticTransform",
        "RandAugment",
        "AutoAugment",
        "TrivialAugmentWide",
        "AugMix",
        "ScaleJitter",
        "JPEG",
        "CutMix",
        "MixUp",
    }
)


class KeywordInputs(dict):
    """Inputs a model takes as keyword arguments: a Hugging Face text batch without its
    labels (``input_ids``, ``attention_mask``…), called as ``model(**inputs)``."""


def call_model(model: Callable[..., Any], inputs: Any) -> Any:
    """The model's output for one batch's inputs, however the batch passes them."""
    return model(**inputs) if isinstance(inputs, KeywordInputs) else model(inputs)


def to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """Tensors of a batch (nested in tuples, lists, mappings) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, device, non_blocking) for b in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, Mapping):
        items = {k: to_device(v, device, non_blocking) for k, v in batch.items()}
        return KeywordInputs(items) if isinstance(batch, KeywordInputs) else items
    return batch


_PAIR_KEYS = (
    ("x", "y"),
    ("input", "target"),
    ("inputs", "targets"),
    ("image", "label"),
    ("pixel_values", "labels"),
)


def split_batch(batch: Any, param: str = "train") -> tuple[Any, torch.Tensor]:
    """(inputs, targets) from the usual batch shapes: ``(x, y)``, a mapping with one of the
    key pairs above (a dict, or the ``BatchEncoding`` a Hugging Face collator returns), or a
    text batch: ``input_ids`` with ``labels``, the rest of the batch passed as keywords
    (:class:`KeywordInputs`). ``param`` names the argument the batch came from."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping):
        for xk, yk in _PAIR_KEYS:
            if xk in batch and yk in batch:
                return batch[xk], batch[yk]
        if "input_ids" in batch and "labels" in batch:
            keywords = KeywordInputs((k, v) for k, v in batch.items() if k != "labels")
            return keywords, batch["labels"]
    if isinstance(batch, (list, tuple)):
        shape = f"a {type(batch).__name__} of {len(batch)}"
    elif isinstance(batch, Mapping):
        shape = f"a {type(batch).__name__} with keys {', '.join(map(str, batch))}"
    else:
        shape = f"a {type(batch).__name__}"
    pairs = ", ".join(f"{x}/{y}" for x, y in _PAIR_KEYS)
    raise TorchMagicError(
        f"{param} must yield (inputs, targets) batches, mappings with {pairs}, or text "
        f"batches with input_ids/labels; got {shape}",
        param=param,
    )


def base_dataset(dataset: object) -> object:
    """The dataset under any ``Subset`` wrappers (where ``transform`` and ``classes`` live)."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def transform_parts(transform: Any) -> Iterator[Any]:
    stack = [transform]
    while stack:
        t = stack.pop()
        if t is None:
            continue
        yield t
        for attr in ("transforms", "transform"):
            inner = getattr(t, attr, None)
            if isinstance(inner, (list, tuple)):
                stack.extend(inner)
            elif inner is not None and inner is not t and callable(inner):
                stack.append(inner)


def random_transforms(dataset: Dataset) -> list[str]:
    """Names of torchvision random augmentations in the dataset's transforms."""
    base = base_dataset(dataset)
    found = []
    for attr in ("transform", "transforms", "target_transform"):
        for part in transform_parts(getattr(base, attr, None)):
            cls = type(part)
            if not cls.__module__.startswith("torchvision.transforms"):
                continue
            if cls.__name__.startswith("Random") or cls.__name__ in _RANDOM_TRANSFORMS:
                found.append(cls.__name__)
    return found


def next_epoch_indices(loader: DataLoader) -> list[list[int]]:
    """The dataset indices of each batch the loader's next ``iter()`` would yield,
    consuming the random state exactly as that ``iter()`` would (torch draws the workers'
    base seed from ``loader.generator`` as the iterator is created, then the sampler's
    seed on its first index), so a cached epoch visits the same batches in the same order.
    """
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError("an IterableDataset has no indices")
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    sampler_iter = iter(sampler)
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
    if not collates(loader):  # one index per batch
        return [[i] for i in sampler_iter]
    return [list(batch) for batch in sampler_iter]


def collates(loader: DataLoader) -> bool:
    """Whether the loader draws index lists and collates them: with ``batch_size`` or a
    ``batch_sampler`` of its own (then ``batch_size`` is None), not with ``batch_size=None``."""
    return loader.batch_sampler is not None


def load_batch(loader: DataLoader, indices: list[int]) -> Any:
    """One batch fetched in this process, as the loader's workers would collate it."""
    samples = [loader.dataset[i] for i in indices]
    return loader.collate_fn(samples) if collates(loader) else samples[0]
