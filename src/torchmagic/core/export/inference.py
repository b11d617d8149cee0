"""A model exported for inference (``.pt2``, ``.safetensors``, ``.onnx``), checked before
it is kept.

The file is made from :func:`prepare.inference_copy` (adapters merged, BatchNorm in
eval, our hooks gone; the live model is untouched) with the labels and preprocessing
stored, written under a temporary name, read back from the file alone and run on a
probe batch of another size than the traced example; its outputs are compared with the
live model's eval outputs. Above ``tolerance`` it is refused and no file is left.

The probe's input, one sample's shape (the batch size is ours: 2 is traced, since
``torch.export`` specialises a batch of 1, and 3 probes):

1. ``input_shape`` (its first number, the batch, is not used);
2. the crop size of the weights the model was loaded with (``load_model``): ``3×S×S``;
3. a timm model's ``pretrained_cfg["input_size"]``;
4. a Hugging Face config: ``image_size`` and ``num_channels``, or token ids of length
   ``min(16, max_position_embeddings)`` below ``vocab_size``.

Otherwise the export is refused in one line naming ``input_shape``. Float inputs are
drawn from a seeded generator of their own (the global RNG is not touched).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..advice import Option
from ..errors import TorchMagicError
from ..integrations import peft
from ..modules import unwrap
from . import formats, metadata
from .files import replaced_atomically
from .metadata import Preprocessing
from .prepare import inference_copy

if TYPE_CHECKING:
    from ..zoo import LoadedModel

EXAMPLE_BATCH = 2  # traced: torch.export would specialise a batch of 1
PROBE_BATCH = 3  # checked: another size, so the file's batch is shown to be dynamic
TOKENS = 16  # a text model's probe length (at most its max_position_embeddings)


@dataclass(frozen=True)
class ExportOptions:
    """How an export is made and checked."""

    force: bool = False  # replace an existing file
    # one batch's shape, batch first (e.g. (1, 3, 224, 224)); None: derived (see above)
    input_shape: tuple[int, ...] | None = None
    tolerance: float = 1e-4  # largest |file - live model| allowed on the probe's outputs


@dataclass(frozen=True)
class InferenceReport:
    """What an inference export wrote and how well the file matched the live model."""

    model_name: str
    format: str  # "pt2", "safetensors", "onnx"
    path: str
    nbytes: int
    max_difference: float | None  # None: not checked (onnx without onnxruntime)
    tolerance: float
    probe_shape: tuple[int, ...]  # the batch the file was checked on
    labels: tuple[str, ...] | None
    preprocessing: Preprocessing | None
    merged_adapters: int  # LoRA layers folded into the file's weights


@dataclass(frozen=True)
class Probe:
    """The input a model takes: one sample's shape; token ids below ``vocab`` or floats."""

    shape: tuple[int, ...]
    vocab: int | None = None

    def batch(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        generator = torch.Generator().manual_seed(size)
        if self.vocab is not None:
            return torch.randint(self.vocab, (size, *self.shape), generator=generator)
        return torch.randn((size, *self.shape), generator=generator).to(dtype)

    def dtype_name(self, dtype: torch.dtype) -> str:
        return "int64" if self.vocab is not None else str(dtype).removeprefix("torch.")


def _probe(
    model: nn.Module, name: str, loaded: LoadedModel | None, input_shape: tuple[int, ...] | None
) -> Probe:
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if input_shape is not None:
        if len(input_shape) < 2:
            raise TorchMagicError(
                f"input_shape={','.join(map(str, input_shape))}: give a batch's shape, "
                "batch first (e.g. 1,3,224,224)",
                param="input_shape",
            )
        text = isinstance(vocab, int) and len(input_shape) == 2
        return Probe(input_shape[1:], vocab if text else None)
    crop = loaded.info.crop_size if loaded is not None and loaded.info is not None else None
    if crop:
        return Probe((3, crop, crop))
    timm_config = getattr(model, "pretrained_cfg", None)
    if isinstance(timm_config, dict) and timm_config.get("input_size"):
        return Probe(tuple(timm_config["input_size"]))
    side, channels = getattr(config, "image_size", None), getattr(config, "num_channels", None)
    if isinstance(side, int) and isinstance(channels, int):
        return Probe((channels, side, side))
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(vocab, int) and isinstance(positions, int):
        return Probe((min(TOKENS, positions),), vocab)
    raise TorchMagicError(
        (
            f"cannot tell what input '{name}' takes: give one batch's shape, ",
            Option("input_shape", "1,3,224,224"),
        ),
        param="input_shape",
    )


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode under inference_mode, with full-precision float32 on CUDA
    (no TF32), then every module's mode and the precision flags as they were."""
    modes = [(m, m.training) for m in model.modules()]
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        model.eval()
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        with torch.inference_mode():
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
        for module, training in modes:
            module.training = training


def _live_outputs(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with _evaluating(model):
        return formats.output_tensor(model(batch.to(device))).float().cpu()


def _one_line(exc: BaseException) -> str:
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return first if len(first) <= 160 else first[:157] + "..."


def check_export(
    model: nn.Module, name: str, loaded: LoadedModel | None, suffix: str, options: ExportOptions
) -> None:
    """Refuse what :func:`export` would refuse before it writes, without running the
    model: a tolerance below 0, a format whose packages are missing, an input that
    cannot be told."""
    if not options.tolerance >= 0:
        raise TorchMagicError(
            f"tolerance={options.tolerance:g}: the largest difference allowed, 0 or more",
            param="tolerance",
        )
    formats.check_ready(suffix)
    _probe(unwrap(model), name, _still_loaded(model, loaded), options.input_shape)


def _still_loaded(model: nn.Module, loaded: LoadedModel | None) -> LoadedModel | None:
    """What ``load_model`` gave, unless the variable was rebound since."""
    if loaded is not None and unwrap(loaded.model) is not unwrap(model):
        return None
    return loaded


def export(
    model: nn.Module,
    name: str,
    loaded: LoadedModel | None,
    path: str,
    suffix: str,
    options: ExportOptions,
    *,
    labels: tuple[str, ...] | None = None,
    preprocessing: metadata.Preprocessing | None = None,
) -> InferenceReport:
    """Write ``model`` for inference to ``path`` in the format of ``suffix`` (checked by
    ``files.destination``), verified against the live model (see the module's docstring).
    ``labels``: the class names the session keeps for it; ``preprocessing``: the
    transforms it was trained with when known (``load_data``'s), else the weights'."""
    check_export(model, name, loaded, suffix, options)
    kind = formats.FORMATS[suffix]
    loaded = _still_loaded(model, loaded)
    probe = _probe(unwrap(model), name, loaded, options.input_shape)
    twin = inference_copy(model)
    dtype = next((p.dtype for p in twin.parameters() if p.is_floating_point()), torch.float32)
    checked = probe.batch(PROBE_BATCH, dtype)
    reference = _live_outputs(model, checked)
    labels = metadata.labels_of(twin, loaded, reference.shape[-1], labels)
    preprocessing = preprocessing or metadata.preprocessing_of(loaded)
    stored = metadata.fields(labels, preprocessing, probe.shape, probe.dtype_name(dtype))
    adapters = len(peft.lora_layers(unwrap(model)))
    module = formats.Outputs(twin).eval()
    with replaced_atomically(path) as temporary:
        try:
            kind.write(module, probe.batch(EXAMPLE_BATCH, dtype), stored, temporary)
        except (TorchMagicError, OSError):
            raise
        except Exception as exc:  # torch.export's refusals come in many classes
            if not kind.traced:
                raise
            raise TorchMagicError(
                f"torch.export cannot trace the forward of '{name}' with a dynamic batch "
                f"({_one_line(exc)}); a .safetensors path exports its weights instead",
                param="path",
            ) from None
        run, read_back = kind.read(temporary, module)
        if any(read_back.get(key) != value for key, value in stored.items()):
            raise TorchMagicError(f"the {suffix} file did not keep its labels and preprocessing")
        difference = None
        if run is not None:
            with torch.inference_mode():
                got = run(checked).float()
            if got.shape == reference.shape:
                difference = float((got - reference).abs().max())
            if difference is None or not difference <= options.tolerance:
                found = "other shapes" if difference is None else f"up to {difference:.3g}"
                raise TorchMagicError(
                    (
                        f"the exported {suffix} file's outputs differ from the live model's "
                        f"({found} on a batch of {PROBE_BATCH}; ",
                        Option("tolerance", f"{options.tolerance:g}"),
                        "); nothing was written",
                    ),
                    param="tolerance",
                )
        nbytes = os.path.getsize(temporary)
    return InferenceReport(
        name,
        suffix.lstrip("."),
        path,
        nbytes,
        difference,
        options.tolerance,
        tuple(checked.shape),
        labels,
        preprocessing,
        adapters,
    )
