"""Leaving torchmagic with a file, by the path's suffix.

- ``files.py``: the suffixes, the destination's checks, the atomic write.
- ``script.py``: ``.py``, the session's commands as a script of Session calls.
- ``inference.py``: ``.pt2`` / ``.safetensors`` / ``.onnx``, the model for inference,
  verified against the live model before it is kept (options, probe input, report).
- ``prepare.py``: the inference copy (adapters merged, BatchNorm in eval, our hooks gone).
- ``formats.py``: one writer and reader per inference format.
- ``metadata.py``: the labels and preprocessing stored in the file.
"""

from .inference import ExportOptions, InferenceReport
from .script import ExportReport

__all__ = ["ExportOptions", "ExportReport", "InferenceReport"]
