"""Renderable for ``load_model``: the model built and what its weights expect."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ..core.zoo import LoadedModel, WeightsInfo
from . import theme
from .base import Rendered, human, table


def _floats(values: tuple[float, ...] | None) -> str:
    return "?" if values is None else "(" + ", ".join(f"{v:.3f}" for v in values) + ")"


def weights_table(info: WeightsInfo):
    drawn = table(info.name, (("", "left"), ("", "left")), whole=(0,), show_header=False)
    if info.num_params is not None:
        drawn.add_row("parameters", human(info.num_params))
    for dataset, metric, value in info.metrics:
        drawn.add_row(f"{dataset} {metric}", f"{value:.2f}")
    if info.crop_size is not None:
        size = f"{info.crop_size}×{info.crop_size}"
        if info.resize_size is not None:
            size += f" (resize {info.resize_size}, center crop)"
        drawn.add_row("input", size)
    drawn.add_row("normalise", f"mean {_floats(info.mean)} std {_floats(info.std)}")
    if info.num_categories is not None:
        drawn.add_row("categories", str(info.num_categories))
    if info.file_mb is not None:
        drawn.add_row("download", f"{info.file_mb:.1f} MB")
    return drawn


def loaded_model(loaded: LoadedModel, width: int | None = None) -> Rendered:
    title = Text()
    title.append(f"{loaded.name}", style="bold")
    params = sum(p.numel() for p in loaded.model.parameters())
    title.append(f" ({loaded.source}, {human(params)} parameters) ")
    if loaded.weights is None:
        title.append("with random weights (weights=None)", style=theme.style("warning"))
    else:
        title.append("with pretrained weights", style=theme.style("ok"))
    parts: list[RenderableType] = [title]
    if loaded.info is not None:
        parts.append(weights_table(loaded.info))
    if loaded.preprocess is None and loaded.weights is None:
        parts.append(Text("no preprocess: normalise the inputs yourself", style=theme.style("dim")))
    return Rendered(Group(*parts), width)
