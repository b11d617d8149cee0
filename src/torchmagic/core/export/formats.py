"""One writer and one reader per inference format, each with the field's own library:
``torch.export`` for ``.pt2``, ``safetensors`` for ``.safetensors``, ``torch.onnx`` (and
onnx, onnxruntime) for ``.onnx``. A writer gets the inference copy wrapped to return one
tensor, an example batch and the metadata; a reader gives back a function from a batch
to the outputs, run from the file alone, and the metadata it stored."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import TorchMagicError
from .metadata import KEYS

Run = Callable[[torch.Tensor], torch.Tensor]


def output_tensor(output: object) -> torch.Tensor:
    """A forward's result as the one tensor a file returns: itself, a Hugging Face
    output's ``logits``, the first of a tuple or list."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TorchMagicError(
        f"the model's forward returns {type(output).__name__}: an export needs a tensor, "
        "logits or a tuple starting with one"
    )


class Outputs(nn.Module):
    """The inference copy, returning one tensor (what a traced file returns)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return output_tensor(self.model(batch))


def _dynamic_batch() -> tuple[dict[int, object]]:
    return ({0: torch.export.Dim("batch", min=1)},)


def _write_pt2(module: Outputs, example: torch.Tensor, meta: dict[str, str], path: str) -> None:
    program = torch.export.export(module, (example,), dynamic_shapes=_dynamic_batch())
    torch.export.save(program, path, extra_files=meta)


def _read_pt2(path: str, module: Outputs) -> tuple[Run, dict[str, str]]:
    meta = dict.fromkeys(KEYS, "")
    loaded = torch.export.load(path, extra_files=meta).module()
    return loaded, meta


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor with storage of its own (safetensors refuses shared storage; a tied
    weight is written under each of its names, so a strict load finds every key)."""
    seen: set[int] = set()
    out = {}
    for key, tensor in state.items():
        tensor = tensor.detach().contiguous()
        where = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if where in seen else tensor
        seen.add(where)
    return out


def _write_safetensors(
    module: Outputs, example: torch.Tensor, meta: dict[str, str], path: str
) -> None:
    from safetensors.torch import save_file

    save_file(_unshared(module.model.state_dict()), path, metadata=meta)


def _read_safetensors(path: str, module: Outputs) -> tuple[Run, dict[str, str]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, "pt") as stream:
        meta = dict(stream.metadata() or {})
    module.model.load_state_dict(load_file(path), strict=True)  # the plain keys, all of them
    return module, meta


def _write_onnx(module: Outputs, example: torch.Tensor, meta: dict[str, str], path: str) -> None:
    import onnx

    torch.onnx.export(
        module,
        (example,),
        path,
        dynamo=True,
        external_data=False,  # one file, which the atomic rename moves whole
        verbose=False,
        input_names=["input"],
        output_names=["output"],
        dynamic_shapes=_dynamic_batch(),
    )
    graph = onnx.load(path)
    onnx.helper.set_model_props(graph, meta)
    onnx.save(graph, path)


def _read_onnx(path: str, module: Outputs) -> tuple[Run | None, dict[str, str]]:
    import onnx

    graph = onnx.load(path)
    onnx.checker.check_model(graph)
    meta = {p.key: p.value for p in graph.metadata_props}
    if importlib.util.find_spec("onnxruntime") is None:
        return None, meta
    import onnxruntime  # type: ignore[import-untyped]

    runner = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])

    def run(batch: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(runner.run(None, {"input": batch.numpy()})[0])

    return run, meta


@dataclass(frozen=True)
class Format:
    """How one suffix is written and read back; ``traced``: made by ``torch.export``;
    ``needs``: the packages it cannot do without (onnxruntime is optional: with it, an
    onnx file's outputs are checked too)."""

    write: Callable[[Outputs, torch.Tensor, dict[str, str], str], None]
    read: Callable[[str, Outputs], tuple[Run | None, dict[str, str]]]
    traced: bool
    needs: tuple[str, ...] = ()


FORMATS = {
    ".pt2": Format(_write_pt2, _read_pt2, traced=True),
    ".safetensors": Format(_write_safetensors, _read_safetensors, False, ("safetensors",)),
    ".onnx": Format(_write_onnx, _read_onnx, True, ("onnx", "onnxscript")),
}


def check_ready(suffix: str) -> None:
    """Refuse in one line a format whose packages are missing, naming them."""
    missing = [m for m in FORMATS[suffix].needs if importlib.util.find_spec(m) is None]
    if missing:
        raise TorchMagicError(
            f"exporting {suffix} needs {' and '.join(missing)}: pip install {' '.join(missing)}",
            param="path",
        )
