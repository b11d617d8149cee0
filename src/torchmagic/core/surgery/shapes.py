"""Output shapes per module, as Keras' and torchinfo's summaries show them: one forward
pass of a meta-device replica on an input of the given shape (no memory, no arithmetic;
the model, its statistics and the RNG are untouched), with a hook on every module.

The user's forward hooks do not run on the replica (they would see meta tensors); its
pre-hooks do, as weight_norm and pruning compute weights in them. A model that cannot run
on the meta device (an op that reads values, such as ``.item()``
or a data-dependent shape) is refused in one line naming the module where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import TorchMagicError
from ..meta import compute_dtype, meta_replica, refuse_lazy
from ..tensors import leaves


@dataclass(frozen=True)
class ModuleOutput:
    """What a module returned during the pass: the shape of its first tensor (more
    tensors: ``tensors`` counts them), the bytes of all its output tensors summed over
    its calls, and how often it ran."""

    shape: tuple[int, ...]
    tensors: int
    nbytes: int
    calls: int


@dataclass(frozen=True)
class Shapes:
    input_shape: tuple[int, ...]
    outputs: dict[str, ModuleOutput]  # by qualified name; "" is the model
    activation_bytes: int  # output bytes of every leaf module's calls


def _input_dtype(model: nn.Module) -> torch.dtype:
    """Token ids for a model that starts with an embedding, else its compute dtype."""
    first = next((m for m in model.modules() if next(m.parameters(False), None) is not None), None)
    return torch.long if isinstance(first, nn.Embedding) else compute_dtype(model)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(error).__name__}: {line[:120]}" if line else type(error).__name__


def _takes(module: nn.Module) -> str:
    """The input a layer takes, in words: ``(batch, 3, H, W)``; "" for other modules."""
    if isinstance(module, nn.modules.conv._ConvNd):
        sizes = (
            ("L",) if len(module.kernel_size) == 1 else ("D", "H", "W")[-len(module.kernel_size) :]
        )
        return f"(batch, {module.in_channels}, {', '.join(sizes)})"
    if isinstance(module, nn.Linear):
        return f"(batch, …, {module.in_features})"
    return ""


def _misfit(shape: tuple[int, ...], where: str, module: nn.Module, error: Exception) -> str:
    """Why the model could not run on an input of ``shape``, in our words: what the layer
    that refused it takes (torch's own message only where we cannot say that)."""
    layer = f"{where or 'the model'} ({type(module).__name__})"
    takes = _takes(module)
    if not takes:
        return f"input_shape {shape}: the forward failed in {layer}: {_first_line(error)}"
    return (
        f"input_shape {shape} does not fit the model: {layer} takes {takes}; give the shape "
        "batch first, e.g. (1, 3, 224, 224), or leave it out"
    )


def output_shapes(model: nn.Module, input_shape: Sequence[int]) -> Shapes:
    """Every module's output on a meta input of ``input_shape`` (batch dimension
    included: ``(1, 3, 224, 224)``), by the names ``model.named_modules()`` gives."""
    shape = tuple(int(n) for n in input_shape)
    if not shape or any(n < 1 for n in shape):
        raise TorchMagicError(
            f"input_shape must be positive sizes, got {tuple(input_shape)}", param="input_shape"
        )
    refuse_lazy(model, "the summary")
    replica = meta_replica(model).eval()  # as for a prediction: BatchNorm on its statistics
    for module in replica.modules():  # the user's own forward hooks would see meta tensors
        module._forward_hooks.clear()  # (pre-hooks stay: weight_norm and pruning need them)
        module._forward_hooks_with_kwargs.clear()
        module._forward_hooks_always_called.clear()
    names = {id(m): n for n, m in replica.named_modules()}
    leaf_modules = {id(m) for m in replica.modules() if not m._modules}
    found: dict[str, list[torch.Tensor]] = {}
    found_bytes: dict[str, int] = {}
    calls: dict[str, int] = {}
    running: list[str] = []  # the modules whose forward has started and not finished
    activation = 0

    def entered(module: nn.Module, args: object) -> None:
        running.append(names[id(module)])

    def finished(module: nn.Module, args: object, output: object) -> None:
        nonlocal activation
        name = running.pop() if running else names[id(module)]
        tensors = list(leaves(output))
        calls[name] = calls.get(name, 0) + 1
        found.setdefault(name, tensors)
        size = sum(t.numel() * t.element_size() for t in tensors)
        found_bytes[name] = found_bytes.get(name, 0) + size
        if id(module) in leaf_modules:
            activation += size

    hooks = []
    for module in replica.modules():
        hooks.append(module.register_forward_pre_hook(entered))
        hooks.append(module.register_forward_hook(finished))
    x = torch.zeros(shape, dtype=_input_dtype(model), device="meta")
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            replica(x)
    except Exception as error:  # the shape does not fit, or an op cannot run on meta
        where = running[-1] if running else ""
        message = _misfit(shape, where, replica.get_submodule(where), error)
        raise TorchMagicError(message, param="input_shape") from None
    finally:
        for hook in hooks:
            hook.remove()
    outputs = {
        name: ModuleOutput(
            tuple(tensors[0].shape) if tensors else (),
            len(tensors),
            found_bytes[name],
            calls[name],
        )
        for name, tensors in found.items()
    }
    return Shapes(shape, outputs, activation)
