"""Finding a model's classification heads and building their replacements.

A head is a head. The layer replaced must be

* a ``Linear``, or a ``Conv2d`` with a 1x1 kernel and one group (a conv classifier), and
* the layer that makes the model's output: after it runs, nothing with parameters runs
  (activation, dropout, flatten, pooling and identity may follow).

The second point is established by the first of:

1. the model's library: timm's ``get_classifier()`` (every head it returns, so a distilled
   model's ``head_dist`` changes with ``head``), or a Hugging Face model's classifier
   attributes (``classifier``, ``cls_classifier`` + ``distillation_classifier``, ``score``).
   Inside such a module the last Linear is the head (RoBERTa's ``classifier.out_proj``,
   LeViT's ``head.linear``), and what surrounds it (timm's pooling) is kept;
2. the module structure: walking up from the layer, at every ``Sequential`` only modules
   without parameters follow it, and every other step goes through a head's name (``fc``,
   ``classifier``, ``head``, ``heads``, ...), as torchvision's ``fc``, ``classifier.6`` and
   ``heads.head``;
3. one forward on the meta device (no memory, no arithmetic) with an input shaped for the
   model's first layer: no module with parameters starts after the layer finishes. Only
   when no such input runs does the last layer with parameters, in registration order,
   count as the head.

On ``auto``, torchvision-style auxiliary classifiers (GoogLeNet's ``aux1``/``aux2``, Inception
v3's ``AuxLogits``) are replaced with the main head. A named layer or sub-tree must be, or
hold, a head by this rule; anything else is refused with the real heads listed, before
anything changes (``replace_head("layer4", 10)`` on a ResNet names no head).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, count
from typing import Any

import torch
from torch import nn

from ..devices.hostmem import machine_memory
from ..errors import TorchMagicError
from ..integrations import peft
from ..tensors import leaves

HEAD_PATHS = ("fc", "classifier", "heads.head", "head", "heads", "last_linear")
HEAD_NAMES = frozenset({"fc", "classifier", "head", "heads", "head_dist", "last_linear"})
AUX_HEAD_PATHS = ("aux1.fc2", "aux2.fc2", "AuxLogits.fc")
HF_HEAD_NAMES = ("classifier", "cls_classifier", "distillation_classifier", "score")
META_SIDES = (224, 64, 32, 28)  # spatial sizes tried for the meta forward of a conv net
HEAD_TYPES = (nn.Linear, nn.Conv2d)
# More classes than the largest label sets in use (extreme classification) is a typo.
MAX_CLASSES = 1_000_000


@dataclass(frozen=True)
class Head:
    """A head layer at its qualified name in the model.

    ``role``: ``main``; ``distillation`` (a second head the model combines with the main
    one, replaced with it); ``auxiliary`` (a training-time side classifier).
    """

    name: str
    module: nn.Module
    role: str = "main"

    @property
    def in_features(self) -> int:
        m = self.module
        if isinstance(m, nn.Linear):
            return m.in_features
        assert isinstance(m, nn.Conv2d)
        return m.in_channels

    @property
    def out_features(self) -> int:
        m = self.module
        if isinstance(m, nn.Linear):
            return m.out_features
        assert isinstance(m, nn.Conv2d)
        return m.out_channels


def is_head_layer(module: nn.Module) -> bool:
    """A Linear, or a 1x1 single-group Conv2d (SqueezeNet's, timm's conv classifiers)."""
    if isinstance(module, nn.Linear):
        return True
    return isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1) and module.groups == 1


def _describe(module: nn.Module) -> str:
    if isinstance(module, nn.Linear):
        return f"Linear {module.in_features}→{module.out_features}"
    if isinstance(module, nn.Conv2d):
        k = "x".join(str(s) for s in module.kernel_size)
        return f"Conv2d {k} {module.in_channels}→{module.out_channels}"
    return type(module).__name__


def _has_params(module: nn.Module, recurse: bool = True) -> bool:
    return any(True for _ in module.parameters(recurse=recurse))


def _lookup(root: nn.Module, path: str) -> nn.Module | None:
    module: nn.Module | None = root
    for part in path.split("."):
        module = module._modules.get(part) if module is not None else None
    return module


def _within(name: str, ancestor: str) -> bool:
    return ancestor == "" or name == ancestor or name.startswith(ancestor + ".")


def _last_head_layer(module: nn.Module, prefix: str, role: str = "main") -> Head | None:
    """The last head layer inside ``module`` in registration order that the forward runs
    (in a peft ``modules_to_save`` wrapper: the active trained copy)."""
    found = None
    passive = peft.passive_paths(module, prefix)
    for name, sub in module.named_modules(prefix=prefix):
        if is_head_layer(sub) and not any(_within(name, p) for p in passive):
            found = Head(name, sub, role)
    return found


def _library_heads(
    model: nn.Module, modules: Sequence[tuple[str, nn.Module]] | None = None
) -> list[Head] | None:
    """Heads the model's library declares (timm, Hugging Face), or None for other models;
    ``modules``: the model's, by name, when the caller has walked it."""
    slots: list[tuple[str, nn.Module]] = []
    get_classifier = getattr(model, "get_classifier", None)
    if callable(get_classifier):
        declared = get_classifier()
        wanted = declared if isinstance(declared, tuple) else (declared,)
        named = model.named_modules() if modules is None else modules
        names = {id(m): n for n, m in named if n}
        slots = [(names[id(m)], m) for m in wanted if id(m) in names]
    if not slots and hasattr(getattr(model, "config", None), "id2label"):
        slots = [(n, m) for n in HF_HEAD_NAMES if (m := model._modules.get(n)) is not None]
    if not slots:
        return None
    found = []
    for index, (name, slot) in enumerate(slots):
        role = "main" if index == 0 else "distillation"
        head = Head(name, slot, role) if is_head_layer(slot) else _last_head_layer(slot, name, role)
        if head is None:
            raise TorchMagicError(
                f"{type(model).__name__} was built without a classifier ({name} is a "
                f"{type(slot).__name__}): build it with the number of classes you want "
                "(timm: num_classes=, Hugging Face: num_labels=)"
            )
        found.append(head)
    return found


def _trails(model: nn.Module, name: str) -> bool:
    """Structure alone shows that ``name``'s output is the model's output (a peft trained
    copy's is its wrapper's)."""
    parts = (peft.copy_wrapper(model, name) or name).split(".")
    for depth in reversed(range(len(parts))):
        parent, part = model.get_submodule(".".join(parts[:depth])), parts[depth]
        if isinstance(parent, nn.Sequential):
            keys = list(parent._modules)
            later = keys[keys.index(part) + 1 :]
            if any(_has_params(parent._modules[k]) for k in later if parent._modules[k]):
                return False
        elif part not in HEAD_NAMES:
            return False
    return True


def _meta_inputs(model: nn.Module) -> Iterator[torch.Tensor]:
    """Inputs on the meta device shaped for the first Embedding, Linear and conv layer (in
    registration order, which is usually, not always, the order they run in)."""
    kinds = (nn.Embedding, nn.Linear, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
    firsts: dict[object, Any] = {}
    for module in model.modules():
        kind = next((k for k in kinds if isinstance(module, k)), None)
        if kind is not None:
            firsts.setdefault(kind, module)
    for first in firsts.values():
        if isinstance(first, nn.Embedding):
            yield torch.zeros(2, 16, dtype=torch.long, device="meta")
        elif isinstance(first, nn.Linear):
            yield torch.empty(2, first.in_features, device="meta")
        else:
            for side in META_SIDES:
                yield torch.empty(
                    2, first.in_channels, *[side] * len(first.kernel_size), device="meta"
                )


class _MetaTrace:
    """One forward on the meta device: when each module starts and finishes, and which
    modules' outputs the model returns as they are.

    Parameters and buffers are stood in for by meta tensors (``functional_call``), so the
    model's weights, running statistics and device are untouched.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.start: dict[str, int] = {}
        self.end: dict[str, int] = {}
        self.returned: set[str] = set()
        self.ran = self._run()

    def _run(self) -> bool:
        step = count()
        made: dict[str, torch.Tensor] = {}

        def finished(name: str, output: object) -> None:
            self.end[name] = next(step)
            if isinstance(output, torch.Tensor):
                made[name] = output

        # a forward may cache tensors on its modules (rotary tables, lazy shapes): every
        # module's plain attributes are put back as they were, so no meta tensor stays
        attributes = [(m, dict(vars(m))) for m in self.model.modules()]
        hooks = []
        for name, module in self.model.named_modules():
            hooks.append(
                module.register_forward_pre_hook(
                    lambda m, a, n=name: self.start.__setitem__(n, next(step))
                )
            )
            hooks.append(module.register_forward_hook(lambda m, a, o, n=name: finished(n, o)))
        try:
            for x in _meta_inputs(self.model):
                self.start.clear()
                self.end.clear()
                made.clear()
                try:  # a probe: any failure (lazy parameters, a wrong shape) means "no"
                    stand_ins = {
                        n: torch.empty_like(t, device="meta")
                        for n, t in chain(
                            self.model.named_parameters(remove_duplicate=False),
                            self.model.named_buffers(remove_duplicate=False),
                        )
                    }
                    with torch.no_grad():
                        result = torch.func.functional_call(self.model, stand_ins, (x,))
                except Exception:
                    continue
                returned = {id(t) for t in leaves(result)}
                self.returned = {n for n, t in made.items() if n and id(t) in returned}
                return True
            return False
        finally:
            for hook in hooks:
                hook.remove()
            for module, saved in attributes:
                vars(module).clear()
                vars(module).update(saved)

    def makes_output(self, name: str) -> bool:
        """``name`` ran, and the model returns its output, or no module with parameters of
        its own started after it finished."""
        if name in self.returned:
            return True
        if name not in self.end:
            return False
        finished = self.end[name]
        return not any(
            began > finished and _has_params(self.model.get_submodule(n), recurse=False)
            for n, began in self.start.items()
        )


def _last_parametrised(model: nn.Module) -> tuple[str, nn.Module] | None:
    last = None
    for name, sub in model.named_modules():
        if _has_params(sub, recurse=False):
            last = (name, sub)
    return last


class _Judge:
    """Decides, lazily and once per model, whether a layer's output is the model's output."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._trace: _MetaTrace | None = None

    @property
    def trace(self) -> _MetaTrace:
        if self._trace is None:
            self._trace = _MetaTrace(self.model)
        return self._trace

    def makes_output(self, name: str) -> bool:
        if _trails(self.model, name):
            return True
        if self.trace.ran:
            return self.trace.makes_output(name)
        last = _last_parametrised(self.model)
        return last is not None and last[0] == name

    def traced_heads(self) -> list[str]:
        """Head layers the meta forward shows making the output (none if it cannot run)."""
        if not self.trace.ran:
            return []
        return [
            n
            for n, m in self.model.named_modules()
            if n and is_head_layer(m) and self.trace.makes_output(n)
        ]


def aux_heads(model: nn.Module) -> list[Head]:
    """Auxiliary classifiers (GoogLeNet's aux1/aux2, Inception v3's AuxLogits)."""
    return [
        Head(path, module, "auxiliary")
        for path in AUX_HEAD_PATHS
        if (module := _lookup(model, path)) is not None and is_head_layer(module)
    ]


def _linear_names(model: nn.Module) -> str:
    linears = [f"{n} ({_describe(m)})" for n, m in model.named_modules() if is_head_layer(m)]
    return ", ".join(linears[-8:]) if linears else "none"


def find_heads(
    model: nn.Module,
    judge: _Judge | None = None,
    modules: Sequence[tuple[str, nn.Module]] | None = None,
) -> list[Head]:
    """Every head of ``model``: the main one first, then distillation and auxiliary heads;
    ``modules`` as for :func:`_library_heads`."""
    if is_head_layer(model):
        raise TorchMagicError(
            "the model itself is a single layer: there is no head to swap in it", param="where"
        )
    library = _library_heads(model, modules)
    if library is not None:
        return library
    judge = judge or _Judge(model)
    for path in HEAD_PATHS:
        slot = _lookup(model, path)
        if slot is None:
            continue
        head = Head(path, slot) if is_head_layer(slot) else _last_head_layer(slot, path)
        if head is not None and _trails(model, head.name):
            return [head, *aux_heads(model)]
    last = _last_parametrised(model)
    if last is not None and is_head_layer(last[1]) and _trails(model, last[0]):
        return [Head(*last)]
    traced = judge.traced_heads()
    if len(traced) == 1:
        return [Head(traced[0], model.get_submodule(traced[0]))]
    if not traced and not judge.trace.ran and last is not None and is_head_layer(last[1]):
        return [Head(*last)]
    what = type(model).__name__
    if traced:
        raise TorchMagicError(
            f"{what} has several outputs, each made by a head: {', '.join(traced)}; "
            "name the one to replace",
            param="where",
        )
    raise TorchMagicError(
        f"no head found in {what}: none of its Linear / 1x1 Conv2d layers "
        f"({_linear_names(model)}) makes the model's output",
        param="where",
    )


def find_head(model: nn.Module) -> Head:
    """The model's main head (what a linear probe trains)."""
    return find_heads(model)[0]


def locate(
    model: nn.Module, where: str | None, modules: Sequence[tuple[str, nn.Module]]
) -> list[Head]:
    """The heads to replace: all of ``model``'s (``where`` None), or those at or inside
    the module named ``where``; a main or distillation head brings the other along.
    A head carrying LoRA adapters is refused: a new head would orphan them.
    ``modules``: the model's, by name (its walk)."""
    heads = _located(model, where, modules)
    adapted = [name for name, m in modules if peft.is_lora_layer(m)]
    for head in heads:
        lora = next((n for n in adapted if _within(head.name, n) or _within(n, head.name)), None)
        if lora is not None:
            raise TorchMagicError(
                f"the head {lora} has LoRA adapters: merge them (%lora merge) or undo the "
                "%lora before replacing it",
                param="where",
            )
    return heads


def _located(
    model: nn.Module, where: str | None, modules: Sequence[tuple[str, nn.Module]]
) -> list[Head]:
    judge = _Judge(model)
    if where is None:
        return find_heads(model, judge, modules)
    declared = _library_heads(model, modules)
    try:
        known = declared if declared is not None else find_heads(model, judge, modules)
    except TorchMagicError:
        known = []
    inside = [h for h in known if _within(h.name, where)]
    if inside:
        main = any(h.role != "auxiliary" for h in inside)
        return [h for h in known if h in inside or (main and h.role != "auxiliary")]
    module = model.get_submodule(where)
    candidate = Head(where, module) if is_head_layer(module) else _last_head_layer(module, where)
    if candidate is not None and declared is None and judge.makes_output(candidate.name):
        return [candidate]
    if candidate is None and not module._modules:
        why = f"it is a {_describe(module)}; a head is a Linear or a 1x1 Conv2d"
    elif candidate is None:
        why = f"it is a {type(module).__name__} with no Linear or 1x1 Conv2d in it"
    elif candidate.name == where:
        why = f"it is a {_describe(module)} whose output is not the model's output"
    else:
        why = (
            f"its last Linear / 1x1 Conv2d, {candidate.name} ({_describe(candidate.module)}), "
            "does not make the model's output"
        )
    real = ", ".join(f"{h.name} ({_describe(h.module)})" for h in known) or "none found"
    raise TorchMagicError(
        f"'{where}' is not a head: {why}. Heads of {type(model).__name__}: {real}",
        param="where",
    )


def _free_bytes(device: torch.device) -> int | None:
    """Memory a new tensor could take on ``device`` now; None where unknown."""
    if device.type == "cpu":
        return machine_memory()[0]
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return None


def check_size(old: nn.Linear | nn.Conv2d, num_classes: int) -> None:
    """Refuse a class count beyond :data:`MAX_CLASSES`, or whose new weight would not fit
    in the memory free on the old head's device, before anything is allocated."""
    if num_classes > MAX_CLASSES:
        raise TorchMagicError(
            f"num_classes={num_classes} is more than {MAX_CLASSES:,} classes", param="num_classes"
        )
    weight = old.weight
    per_class = weight[0].numel() + (1 if getattr(old, "bias", None) is not None else 0)
    needed = per_class * num_classes * weight.element_size()
    free = _free_bytes(weight.device)
    if free is not None and needed > free:
        raise TorchMagicError(
            f"num_classes={num_classes}: the new head needs {needed / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB is free on {weight.device}",
            param="num_classes",
        )


def build_head(old: nn.Module, num_classes: int, dropout: float | None = None) -> nn.Module:
    """A fresh layer with ``old``'s input size, device, dtype, bias and mode."""
    if isinstance(old, HEAD_TYPES):
        check_size(old, num_classes)
    weight = old.weight
    factory = {"device": weight.device, "dtype": weight.dtype}
    if isinstance(old, nn.Linear):
        new: nn.Module = nn.Linear(
            old.in_features, num_classes, bias=old.bias is not None, **factory
        )
    else:
        assert isinstance(old, nn.Conv2d)
        new = nn.Conv2d(
            old.in_channels,
            num_classes,
            old.kernel_size,  # type: ignore[arg-type]  # a Conv2d's own 2-tuples
            stride=old.stride,  # type: ignore[arg-type]
            padding=old.padding,  # type: ignore[arg-type]
            dilation=old.dilation,  # type: ignore[arg-type]
            bias=old.bias is not None,
            padding_mode=old.padding_mode,
            device=factory["device"],
            dtype=factory["dtype"],
        )
    if dropout is not None:
        new = nn.Sequential(nn.Dropout(dropout), new)
    return new.train(old.training)
