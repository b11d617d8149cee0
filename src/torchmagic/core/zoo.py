"""Models by name with the weights, transforms and labels that belong to them.

Replacing the last layer is not enough: pretrained weights expect their own input size
and normalisation, and their outputs mean their own categories. This module builds a
torchvision model with the ``weights=`` API (never ``pretrained=True``), a timm model, or
a Hugging Face image classifier, and returns with it what the weights expect, so the
data pipeline and the doctor can check against it.

The metadata of torchvision and timm weights ships with the library: reading it never
downloads. Building a model *with* weights downloads them once (into ``TORCH_HOME`` /
the Hugging Face cache); offline that fails with one line naming ``weights=None``.
Hugging Face's image processors are downloads too, so offline only config-built models
(``hf:vit``, a ``model_type``) work, without a preprocess.

Offline is told at once, not after the hub's retries: the hubs' own settings
(``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``), else one connection probe of the hub's
endpoint with a short timeout, made only when something is not in the cache. Cached timm
weights load from their file, cached Hugging Face models with ``local_files_only`` when
the hub does not answer. A weights file that ``torch.load(weights_only=True)`` refuses
(a pickle of arbitrary objects) is refused in one line.
"""

from __future__ import annotations

import builtins
import difflib
import importlib.util
import keyword
import os
import pickle
import re
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
from torch import nn

from . import torch_files
from .advice import Option
from .errors import TorchMagicError, first_line

SOURCES = ("torchvision", "timm", "hf")
NO_WEIGHTS = ("none", "None", "")
BOUND_TOO = ("weights", "preprocess", "categories")  # bound beside the model
PROBE_SECONDS = 1.5  # the hub's endpoint must answer a connection within this
_OFFLINE_SETTINGS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TAG = re.compile(r"^[A-Za-z0-9_]+$")  # timm's pretrained tags: a1_in1k, fb_in22k_ft_in1k


@dataclass(frozen=True)
class WeightsInfo:
    """What a set of pretrained weights expects and reports (None: not known)."""

    name: str  # "ResNet18_Weights.IMAGENET1K_V1", "resnet18.a1_in1k", a hub id
    source: str  # "torchvision", "timm" or "hf"
    num_params: int | None = None
    metrics: tuple[tuple[str, str, float], ...] = ()  # (dataset, metric, value)
    crop_size: int | None = None  # side of the square input the weights were trained on
    resize_size: int | None = None  # resize before the crop (torchvision presets)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    num_categories: int | None = None
    file_mb: float | None = None  # download size, when the library says


@dataclass(frozen=True)
class LoadedModel:
    """A built model and what its weights bring. ``weights`` is the torchvision
    ``WeightsEnum`` member (timm: the pretrained tag; hf: the hub id); None without."""

    model: nn.Module
    name: str
    source: str
    weights: Any
    preprocess: Callable | None
    categories: tuple[str, ...] | None
    info: WeightsInfo | None  # None when there are no weights and nothing is known


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _unknown(name: str, known: list[str], where: str) -> TorchMagicError:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return TorchMagicError(f"no model named '{name}' in {where}{hint}", param="name")


def split_source(name: str) -> tuple[str, str]:
    """``"timm:resnet18"`` → ("timm", "resnet18"); a bare name is torchvision's, else
    timm's when timm is installed and knows it."""
    source, sep, rest = name.partition(":")
    if sep and source in SOURCES:
        if not rest:
            raise TorchMagicError(f"'{name}' names no model after '{source}:'", param="name")
        return source, rest
    from torchvision import models

    if name in models.list_models():
        return "torchvision", name
    if _installed("timm"):
        import timm

        if timm.is_model(name):
            return "timm", name
    raise _unknown(name, models.list_models(), "torchvision (prefix timm: or hf: for those)")


def _no_weights(spec: object) -> bool:
    return spec is None or spec is False or (isinstance(spec, str) and spec in NO_WEIGHTS)


# -- torchvision ---------------------------------------------------------------------


def torchvision_weights(name: str, spec: str | None = "DEFAULT") -> Any:
    """The ``WeightsEnum`` member ``spec`` names for model ``name`` (``DEFAULT``, a member
    name such as ``IMAGENET1K_V2``, or ``Enum.MEMBER``); None for no weights."""
    from torchvision import models

    if name not in models.list_models():
        raise _unknown(name, models.list_models(), "torchvision")
    if _no_weights(spec):
        return None
    enum = models.get_model_weights(name)
    member = str(spec).rpartition(".")[2]
    choices = ["DEFAULT", *enum.__members__]
    if member.upper() == "DEFAULT":
        return enum.DEFAULT
    if member not in enum.__members__:
        raise TorchMagicError(
            f"{enum.__name__} has no '{spec}': choose one of {', '.join(choices)} or None",
            param="weights",
        )
    return enum[member]


def _first(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return int(value) if value is not None else None


def _floats(value: Any) -> tuple[float, ...] | None:
    return None if value is None else tuple(float(v) for v in value)


def describe(weights: Any) -> WeightsInfo:
    """Metadata of a torchvision ``WeightsEnum`` member, read from the enum: no download.
    The input size and normalisation come from ``weights.transforms()``."""
    meta = weights.meta
    transforms = weights.transforms()
    metrics = tuple(
        (dataset, metric, float(value))
        for dataset, values in meta.get("_metrics", {}).items()
        for metric, value in values.items()
        if isinstance(value, (int, float))
    )
    categories = meta.get("categories")
    return WeightsInfo(
        name=f"{type(weights).__name__}.{weights.name}",
        source="torchvision",
        num_params=meta.get("num_params"),
        metrics=metrics,
        crop_size=_first(getattr(transforms, "crop_size", None)),
        resize_size=_first(getattr(transforms, "resize_size", None)),
        mean=_floats(getattr(transforms, "mean", None)),
        std=_floats(getattr(transforms, "std", None)),
        num_categories=len(categories) if categories is not None else None,
        file_mb=meta.get("_file_size"),
    )


def is_weights(value: object) -> bool:
    """A torchvision ``WeightsEnum`` member (checked without importing torchvision)."""
    cls = type(value)
    return any(
        base.__name__ == "WeightsEnum" and base.__module__.startswith("torchvision")
        for base in cls.__mro__
    )


def check_binding(name: str, namespace: Mapping[str, object]) -> None:
    """Refuse a variable name a built model may not take: not an identifier, a keyword,
    a builtin (binding ``__builtins__`` or ``len`` breaks every later cell), one of the
    names bound beside the model, or a name bound to something that is not a model (or
    None)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise TorchMagicError(
            f"cannot bind the model to {name!r}: not a Python variable name", param="bind"
        )
    if name in vars(builtins) or name.startswith("__"):
        raise TorchMagicError(
            f"cannot bind the model to '{name}': it is a Python builtin; choose another name",
            param="bind",
        )
    if name in BOUND_TOO:
        raise TorchMagicError(
            f"cannot bind the model to '{name}': that name receives the model's {name}",
            param="bind",
        )
    held = namespace.get(name)  # None (a placeholder) or a model: replaced
    if held is not None and not isinstance(held, nn.Module):
        raise TorchMagicError(
            f"cannot bind the model to '{name}': it holds a {type(held).__name__}, not a "
            "model; choose another name or delete it first",
            param="bind",
        )


def _unsafe_pickle(what: str, error: pickle.UnpicklingError) -> TorchMagicError:
    """``torch.load(weights_only=True)`` refused a file: name the object it met."""
    return TorchMagicError(
        f"refused to load the weights of {what}: {torch_files.load_refusal(error)} "
        "(use a safetensors file)",
        param="name",
    )


def _hub_offline() -> str | None:
    """Why the hub cannot be reached now, or None: the hubs' own offline settings, else
    one connection probe of the hub's endpoint (a thread, so a hanging name lookup is cut
    at the timeout too)."""
    for setting in _OFFLINE_SETTINGS:
        if os.environ.get(setting, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{setting} is set"
    return _probe()


def _probe(timeout: float = PROBE_SECONDS) -> str | None:
    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    address = (url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
    failed: list[str] = []

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
        except OSError as error:
            failed.append(first_line(error))

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout + 0.2)
    if probe.is_alive():
        return f"the hub did not answer within {timeout:g} s"
    return f"the hub cannot be reached: {failed[0]}" if failed else None


def _hub_cached(repo: str, filenames: tuple[str, ...]) -> str | None:
    """The cached path of the first of ``filenames`` in hub repo ``repo``, or None."""
    from huggingface_hub import constants, try_to_load_from_cache

    for filename in filenames:
        found = try_to_load_from_cache(repo, filename, cache_dir=constants.HF_HUB_CACHE)
        if isinstance(found, str):
            return found
    return None


def _fetch_failed(what: str, name: str, error: BaseException | str, where: str) -> TorchMagicError:
    reason = error if isinstance(error, str) else first_line(error)
    return TorchMagicError(
        (
            f"cannot fetch the weights {what} ({reason}); offline? build '{name}' without "
            "them with ",
            Option("weights", None),
            f", or put the file in {where} first",
        ),
        param="weights",
    )


def _vetted(url: str, progress: bool) -> None:
    """The weights at ``url`` in torch's hub cache, read once with ``weights_only=True``
    (fetched first if absent): torchvision's builders load the cached file with
    ``load_state_dict_from_url``'s default ``weights_only=False``, so a file planted there
    must be refused before they see it (``pickle.UnpicklingError``, naming its global)."""
    torch.hub.load_state_dict_from_url(
        url, map_location="cpu", progress=progress, check_hash=True, weights_only=True
    )


def _torchvision(name: str, spec: str | None, progress: bool) -> LoadedModel:
    from torchvision import models

    weights = torchvision_weights(name, spec)
    if weights is None:
        return LoadedModel(
            models.get_model(name, weights=None), name, "torchvision", None, None, None, None
        )
    try:
        _vetted(weights.url, progress)
        model = models.get_model(name, weights=weights, progress=progress)
    except pickle.UnpicklingError as error:
        raise _unsafe_pickle(f"{type(weights).__name__}.{weights.name}", error) from None
    except OSError as error:  # URLError, HTTPError, socket and disk errors
        raise _fetch_failed(
            f"{type(weights).__name__}.{weights.name}",
            name,
            error,
            f"{torch.hub.get_dir()}/checkpoints",
        ) from None
    categories = weights.meta.get("categories")
    return LoadedModel(
        model,
        name,
        "torchvision",
        weights,
        weights.transforms(),
        tuple(categories) if categories else None,
        describe(weights),
    )


# -- timm ----------------------------------------------------------------------------


def _timm_name(name: str, spec: str | None) -> str:
    """``resnet18`` + ``a1_in1k`` → ``resnet18.a1_in1k``; DEFAULT keeps timm's default tag."""
    if _no_weights(spec) or str(spec).upper() == "DEFAULT":
        return name
    return f"{name.partition('.')[0]}.{spec}"


def timm_info(name: str, spec: str | None = "DEFAULT") -> WeightsInfo:
    """Metadata of timm weights from its pretrained config: no download."""
    import timm

    full = _timm_name(name, spec)
    cfg = timm.models.get_pretrained_cfg(full)
    if cfg is None:
        raise _unknown(full, timm.list_pretrained(name.partition(".")[0] + "*"), "timm")
    side = _first(cfg.input_size[-1:])
    return WeightsInfo(
        name=f"{full.partition('.')[0]}.{cfg.tag}" if cfg.tag else full,
        source="timm",
        crop_size=side,
        resize_size=round(side / cfg.crop_pct) if side and cfg.crop_pct else None,
        mean=_floats(cfg.mean),
        std=_floats(cfg.std),
        num_categories=cfg.num_classes or None,
    )


def _timm_file(cfg: Any) -> str | None:
    """The weights file of a timm pretrained config when it is cached already."""
    if getattr(cfg, "file", None):
        return str(cfg.file)
    if getattr(cfg, "hf_hub_id", None):
        names = (cfg.hf_hub_filename,) if cfg.hf_hub_filename else ()
        return _hub_cached(cfg.hf_hub_id, (*names, "model.safetensors", "pytorch_model.bin"))
    if getattr(cfg, "url", None):
        path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(cfg.url))
        return path if os.path.exists(path) else None
    return None


def _maybe_cached_timm(name: str) -> bool:
    """Whether weights of timm's ``name`` may be on disk (the Hugging Face cache holds
    ``models--timm--NAME…``, torch's hub checkpoints a file named after it); False means
    surely not, so that offline can be told before timm is imported (seconds)."""
    from huggingface_hub import constants

    base = name.partition(".")[0]
    hub = Path(constants.HF_HUB_CACHE)
    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    return any(hub.glob(f"models--timm--{base}*")) or any(checkpoints.glob(f"{base}*"))


def _timm(name: str, spec: str | None) -> LoadedModel:
    pretrained = not _no_weights(spec)
    if pretrained and str(spec).upper() != "DEFAULT" and not _TAG.match(str(spec)):
        raise TorchMagicError(
            (
                "timm weights are a pretrained tag such as a1_in1k (or DEFAULT, or None), not "
                f"'{spec}': to use a file, build with ",
                Option("weights", None),
                " and load it with model.load_state_dict(torch.load(path, weights_only=True))",
            ),
            param="weights",
        )
    if pretrained and not _maybe_cached_timm(name) and (offline := _hub_offline()) is not None:
        raise _fetch_failed(name, f"timm:{name}", offline, "the Hugging Face cache")
    import timm
    import timm.data

    full = _timm_name(name, spec)
    if not timm.is_model(full):
        raise _unknown(full, timm.list_models(), "timm")
    overlay: dict[str, Any] = {}
    if pretrained:
        cfg = timm.models.get_pretrained_cfg(full)
        if cfg is None:
            raise _unknown(full, timm.list_pretrained(name.partition(".")[0] + "*"), "timm")
        cached = _timm_file(cfg)
        if cached is not None:
            overlay = {"file": cached}  # no hub request at all
        elif (offline := _hub_offline()) is not None:
            raise _fetch_failed(full, f"timm:{name}", offline, "the Hugging Face cache")
    try:
        extra: dict[str, Any] = {"pretrained_cfg_overlay": overlay} if overlay else {}
        model = timm.create_model(full, pretrained=pretrained, **extra)
    except pickle.UnpicklingError as error:
        raise _unsafe_pickle(f"timm:{full}", error) from None
    except OSError as error:  # the hub's offline / not-found errors are OSErrors
        raise _fetch_failed(full, f"timm:{name}", error, "the Hugging Face cache") from None
    config = timm.data.resolve_data_config({}, model=model)
    info = timm_info(name, spec) if pretrained else None
    categories = None
    if pretrained and (subset := timm.data.infer_imagenet_subset(model)):
        categories = tuple(timm.data.ImageNetInfo(subset).label_descriptions())
    return LoadedModel(
        model,
        full,
        "timm",
        model.pretrained_cfg.get("tag") if pretrained else None,  # type: ignore[operator,union-attr]
        timm.data.create_transform(**config) if pretrained else None,
        categories,
        info,
    )


# -- Hugging Face --------------------------------------------------------------------


def _hf(name: str, spec: str | None) -> LoadedModel:
    local = False  # local_files_only, when the hub does not answer
    if (not _no_weights(spec) or "/" in name) and not os.path.isdir(name):
        offline = _hub_offline()  # before importing transformers: offline answers at once
        if offline is not None:
            if _hub_cached(name, ("config.json",)) is None:
                raise _fetch_failed(
                    name,
                    f"hf:{name}",
                    offline,
                    "the Hugging Face cache (offline, only a model type such as hf:vit builds)",
                )
            local = True
    from transformers import (
        AutoConfig,
        AutoImageProcessor,
        AutoModelForImageClassification,
    )

    try:
        if not _no_weights(spec):
            model = AutoModelForImageClassification.from_pretrained(name, local_files_only=local)
            processor = AutoImageProcessor.from_pretrained(name, local_files_only=local)
        elif "/" in name:
            config = AutoConfig.from_pretrained(name, local_files_only=local)
            model, processor = AutoModelForImageClassification.from_config(config), None
        else:  # a model type: a default config, built offline
            config = AutoConfig.for_model(name)
            model, processor = AutoModelForImageClassification.from_config(config), None
    except pickle.UnpicklingError as error:
        raise _unsafe_pickle(f"hf:{name}", error) from None
    except OSError as error:
        raise _fetch_failed(
            name,
            f"hf:{name}",
            error,
            "the Hugging Face cache (offline, only a model type such as hf:vit builds)",
        ) from None
    except ValueError as error:  # an unknown model type
        raise TorchMagicError(str(error).splitlines()[0], param="name") from None
    config = model.config
    labels = getattr(config, "id2label", None) or {}
    size = getattr(config, "image_size", None)
    info = WeightsInfo(
        name=name,
        source="hf",
        num_params=sum(p.numel() for p in model.parameters()),
        crop_size=_first(size) if isinstance(size, (int, list, tuple)) else None,
        mean=_floats(getattr(processor, "image_mean", None)),
        std=_floats(getattr(processor, "image_std", None)),
        num_categories=len(labels) or None,
    )
    categories = tuple(labels[i] for i in sorted(labels)) if processor is not None else None
    return LoadedModel(
        model, name, "hf", name if processor is not None else None, processor, categories, info
    )


# -- the front door ------------------------------------------------------------------


def weights_info(name: str, weights: str | None = "DEFAULT") -> WeightsInfo | None:
    """What ``weights`` of model ``name`` expect, without building or downloading
    anything (torchvision and timm); None for ``weights=None``."""
    source, bare = split_source(name)
    if _no_weights(weights):
        return None
    if source == "torchvision":
        return describe(torchvision_weights(bare, weights))
    if source == "timm":
        return timm_info(bare, weights)
    raise TorchMagicError(
        "Hugging Face keeps its metadata on the hub: load the model to read it", param="name"
    )


def load_model(
    name: str, weights: str | None = "DEFAULT", *, progress: bool = False
) -> LoadedModel:
    """Build model ``name`` (``resnet18``, ``timm:convnext_tiny``, ``hf:vit``) with
    ``weights``: ``"DEFAULT"``, a named set (``"IMAGENET1K_V2"``; timm: a tag such as
    ``"a1_in1k"``) or None. Returns the model with its preprocess, categories and the
    weights' metadata; replacing the head is the caller's next step."""
    source, bare = split_source(name)
    if source == "torchvision":
        return _torchvision(bare, weights, progress)
    if source == "timm":
        if not _installed("timm"):
            raise TorchMagicError("timm is not installed (pip install timm)", param="name")
        return _timm(bare, weights)
    if not _installed("transformers"):
        raise TorchMagicError(
            "transformers is not installed (pip install transformers)", param="name"
        )
    return _hf(bare, weights)


def expected_inputs(weights: Any) -> WeightsInfo | None:
    """A ``WeightsInfo`` for what ``weights`` is: a ``WeightsInfo`` already, a torchvision
    ``WeightsEnum`` member, or a :class:`LoadedModel`; None otherwise."""
    if isinstance(weights, WeightsInfo):
        return weights
    if isinstance(weights, LoadedModel):
        return weights.info
    if is_weights(weights):
        return describe(weights)
    return None
