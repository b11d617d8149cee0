"""A digest per tensor, written at save and verified at resume, so a flipped bit or an
edited tensor in the file is refused by name instead of training on silently. The digest
is the sum of the tensor's bytes read as 64-bit integers, wrapping (as 32-bit words, then
as bytes, where the size is not a multiple of eight): one changed bit changes it, and it
costs one pass over memory (a CRC over the zip records costs more and names no tensor).
They are written as one JSON text, which the unpickler reads as one string instead of
five objects per tensor (6-10 ms of resnet50's resume); files written before hold a dict of
32-bit word sums, still verified.

Everything else in the file is covered too: a SHA-256 per top-level section (the model's
structure and flags, the param groups and hyper-parameters, scheduler, scaler and RNG states,
the history) over a canonical text of its values, in which each tensor stands as its shape,
dtype and digest. So a changed value, a renamed key, or two same-shaped tensors swapped
together with their digest entries is refused by the section it is in. (The zip records
that are not tensors are checked against their CRC before the file is unpickled: see
``files.read``.) Also checked: every optimizer state of ``torch.optim`` has its parameter's
shape."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch
from torch import nn

# torch.optim's per-parameter states are the parameter's shape or scalars; LBFGS keeps
# flat history instead
_FLAT_STATE = ("torch.optim.lbfgs.LBFGS",)
WORD_BYTES = 8  # what a save sums; the files before summed 4
_WORDS = {8: torch.int64, 4: torch.int32}


def digest(tensor: torch.Tensor, word_bytes: int = WORD_BYTES) -> int:
    """The sum of ``tensor``'s bytes as ``word_bytes``-byte integers (the largest of
    those and 4 that divides its size, else bytes) in an int64 that wraps. On the CPU
    summed by numpy, whose integer reduction is vectorised (torch's single-threaded one
    took 250 ms for resnet50's 100 MB of weights, numpy's 25 ms as 32-bit words, 15 ms as
    64-bit words, which need no widening); elsewhere on the tensor's device. The same
    number either way."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    n = flat.numel()
    size = word_bytes if n % word_bytes == 0 else 4 if n % 4 == 0 else 1
    if size > 1:
        if flat.storage_offset() % size:  # a view of a storage: words start at its start
            flat = flat.clone()
        flat = flat.view(_WORDS[size])
    if flat.device.type == "cpu":
        return int(flat.numpy().sum(dtype=np.int64))
    return int(flat.sum(dtype=torch.int64))


def _tensors(payload: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor the digests cover, named as a refusal names it."""
    for key, value in payload["model"]["state_dict"].items():
        if isinstance(value, torch.Tensor):
            yield key, value
    opt = payload["optimizer"]
    for param, state in ({} if opt is None else opt["state"]).items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield f"the optimizer's {key} of '{param}'", value


def _record(tensor: torch.Tensor) -> list:
    return [list(tensor.shape), str(tensor.dtype), digest(tensor)]


# what each top-level section of a file holds, as a refusal names it
SECTIONS = {
    "model": "the model's weights, structure or flags",
    "optimizer": "the optimizer's param groups, hyper-parameters or state",
    "schedulers": "the scheduler states",
    "scaler": "the GradScaler state",
    "rng": "the RNG states",
    "history": "the history of commands",
    "amp": "the AMP policy",
}


def _canonical(value: object, record: Callable[[torch.Tensor], list], out: list[str]) -> None:
    """``value`` as text, one way only: type-tagged, dicts in their order, floats exact
    (hex), tensors as their record."""
    if isinstance(value, torch.Tensor):
        out.append(f"t{json.dumps(record(value))}")
    elif isinstance(value, Mapping):
        out.append("{")
        for key, item in value.items():
            _canonical(key, record, out)
            out.append(":")
            _canonical(item, record, out)
            out.append(",")
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[" if isinstance(value, list) else "(")
        for item in value:
            _canonical(item, record, out)
            out.append(",")
        out.append("]")
    elif isinstance(value, bool) or value is None:
        out.append(repr(value))
    elif isinstance(value, int):
        out.append(f"i{value}")
    elif isinstance(value, float):
        out.append(f"f{value.hex()}")
    elif isinstance(value, str):
        out.append(f"s{json.dumps(value)}")
    else:  # dtypes, devices: whatever weights_only admits beside the above
        out.append(f"o{type(value).__qualname__}:{value!r}")


def section_digests(
    payload: dict, record: Callable[[torch.Tensor], list] = _record
) -> dict[str, str]:
    """A SHA-256 of each top-level entry but the digests themselves."""
    digests = {}
    for key, value in payload.items():
        if key == "digests":
            continue
        out: list[str] = []
        _canonical(value, record, out)
        digests[key] = hashlib.sha256("".join(out).encode()).hexdigest()
    return digests


def _memo(word_bytes: int) -> Callable[[torch.Tensor], list]:
    """A tensor's record, each tensor digested once however often it is met."""
    seen: dict[int, list] = {}

    def record(tensor: torch.Tensor) -> list:
        key = id(tensor)
        if key not in seen:
            seen[key] = [list(tensor.shape), str(tensor.dtype), digest(tensor, word_bytes)]
        return seen[key]

    return record


def write_digests(payload: dict) -> None:
    """Write the digests of ``payload``'s tensors and sections into it (under
    ``"digests"``), with the size of the words the tensors' sums use."""
    record = _memo(WORD_BYTES)
    records = {name: record(t) for name, t in _tensors(payload)}
    sections = section_digests(payload, record)
    payload["digests"] = json.dumps({"words": WORD_BYTES, "tensors": records, "sections": sections})


def saved_digests(payload: dict) -> tuple[dict[str, list], int, dict[str, str] | None] | None:
    """The file's digests by tensor name, the size of the words they sum and its section
    digests (None in files written before them); None for a file without digests
    (written before them, or by another tool)."""
    digests = payload.get("digests")
    if digests is None:
        return None
    if isinstance(digests, dict):  # written before the JSON text
        return digests, 4, None
    try:
        table = json.loads(digests)
        sections = table.get("sections")
        return (
            dict(table["tensors"]),
            int(table["words"]),
            None if sections is None else dict(sections),
        )
    except (TypeError, ValueError, KeyError, AttributeError):
        return {}, 0, None  # refused by damage: no known word size


def damage(payload: dict) -> str | None:
    """The first tensor whose shape, dtype or digest differs from the one written at save,
    in words; None when all match (a file from before digests has none to compare)."""
    saved_table = saved_digests(payload)
    if saved_table is None:
        return None
    digests, word_bytes, sections = saved_table
    if word_bytes not in _WORDS:
        return "its digests are not readable by this torchmagic"
    record = _memo(word_bytes)
    for name, tensor in _tensors(payload):
        saved = digests.get(name)
        if saved is None:
            return f"{name} was added after the save"
        shape, dtype, value = saved
        if list(tensor.shape) != shape or str(tensor.dtype) != dtype:
            return (
                f"{name} is {list(tensor.shape)} {tensor.dtype} in the file, "
                f"{shape} {dtype} when it was saved"
            )
        if record(tensor)[2] != value:
            odd = ""
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                odd = " (it now holds NaN or inf)"
            return f"{name} was damaged after the save: its digest differs{odd}"
    present = {n for n, _ in _tensors(payload)}
    missing = next((n for n in digests if n not in present), None)
    if missing is not None:
        return f"{missing} is missing from the file"
    if sections is None:  # written before section digests
        return None
    live = section_digests(payload, record)
    for key in {**sections, **live}:
        if sections.get(key) != live.get(key):
            what = SECTIONS.get(key, f"its '{key}' entry")
            return f"the file is damaged: {what} differ from what was saved"
    return None


def state_shape_mismatch(
    optimizer: torch.optim.Optimizer,
    saved: Mapping[str, Mapping],
    params: Mapping[str, nn.Parameter],
) -> str | None:
    """The first optimizer state in ``saved`` (by parameter name) whose tensor is neither a
    scalar nor its parameter's shape, for ``torch.optim``'s optimizers; None otherwise."""
    kind = type(optimizer)
    if not kind.__module__.startswith("torch.optim") or (
        f"{kind.__module__}.{kind.__qualname__}" in _FLAT_STATE
    ):
        return None
    for name, state in saved.items():
        param = params.get(name)
        if param is None:
            return f"the optimizer's state names '{name}', which is not a parameter"
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                return (
                    f"the optimizer's {key} of '{name}' is {list(value.shape)}, "
                    f"its parameter {list(param.shape)}"
                )
    return None
