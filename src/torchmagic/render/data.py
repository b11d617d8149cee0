"""Renderable for ``load_data``: what the folder holds and how it became loaders."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ..core.data import ImageFolders
from . import theme
from .base import Rendered, table

LEAKS_SHOWN = 10  # pairs named before the rest is counted


def _transforms(found: ImageFolders) -> Text:
    drawn = found.pipelines
    if drawn.source is None:
        return Text(
            f"transforms: no known weights, so ImageNet's normalisation at {drawn.size} px "
            f"(load the model with %load_model … --weights to match its weights)",
            style=theme.style("warning"),
        )
    return Text(
        f"transforms: {drawn.source}'s at {drawn.size} px; training adds a random "
        "resized crop and a flip"
    )


def image_folders(found: ImageFolders, width: int | None = None) -> Rendered:
    split = "split by train/ and val/" if found.presplit else f"{found.valid:g} held out (seeded)"
    drawn = table(
        f"{len(found.classes)} classes",
        (("class", "left"), ("train", "right"), ("val", "right")),
        whole=("class", "train", "val"),
    )
    for count in found.counts:
        drawn.add_row(count.name, str(count.train), str(count.val))
    drawn.add_row(
        Text("total", style="bold"),
        str(sum(c.train for c in found.counts)),
        str(sum(c.val for c in found.counts)),
    )
    train_name, val_name = found.bound
    loaders = (
        f"bound {train_name}, {val_name}: batches of {found.train_loader.batch_size}, "
        f"{found.workers} workers, pinned memory {'on' if found.pin_memory else 'off (no GPU)'}"
    )
    where = Text(f"{found.root}/, {split}", style=theme.style("dim"))
    parts: list[RenderableType] = [drawn, where, _transforms(found), Text(loaders)]
    if found.model is not None:
        parts.append(Text(f"class names kept for {found.model}: %replace_head auto sizes its head"))
    if found.imbalance is not None:
        large, small = found.imbalance
        parts.append(
            Text(
                f"imbalanced: {large.name} has {large.train} training images, {small.name} "
                f"{small.train}; accuracy will favour the large classes",
                style=theme.style("warning"),
            )
        )
    if found.leaks:
        parts.append(
            Text(
                f"{len(found.leaks)} validation files have the same bytes as a training file "
                "(a leak: validation scores will read too high):",
                style=theme.style("warning"),
            )
        )
        parts += [Text(f"  {train} = {val}") for train, val in found.leaks[:LEAKS_SHOWN]]
        if len(found.leaks) > LEAKS_SHOWN:
            parts.append(Text(f"  … and {len(found.leaks) - LEAKS_SHOWN} more"))
    return Rendered(Group(*parts), width)
