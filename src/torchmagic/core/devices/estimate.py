"""What one training step will hold, before running it: weights, gradients of the
trainable parameters, optimizer state by optimizer class, and (optionally) the
activations backward keeps, measured on one forward pass.

So the saving of a freeze shows before a step allocates anything: frozen parameters
get no gradient and no optimizer state.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..errors import TorchMagicError
from ..modules import unwrap
from ..tensors import state_bytes, total_bytes
from .placement import reference_device


@dataclass(frozen=True)
class StateRule:
    """Optimizer state of one parameter: ``tensors`` the size of the parameter, plus
    ``scalars`` 0-d tensors (``step`` …)."""

    tensors: int
    scalars: int
    names: str


def _adam(group: Mapping) -> StateRule:
    if group.get("amsgrad"):
        return StateRule(3, 1, "exp_avg, exp_avg_sq, max_exp_avg_sq")
    return StateRule(2, 1, "exp_avg, exp_avg_sq")


def _rmsprop(group: Mapping) -> StateRule:
    names = ["square_avg"]
    if group.get("momentum", 0):
        names.append("momentum_buffer")
    if group.get("centered"):
        names.append("grad_avg")
    return StateRule(len(names), 1, ", ".join(names))


def _sgd(group: Mapping) -> StateRule:
    if group.get("momentum", 0):
        return StateRule(1, 0, "momentum_buffer")
    return StateRule(0, 0, "none (no momentum)")


# torch.optim class name → state per parameter, read from the group's hyper-parameters.
RULES: dict[str, Callable[[Mapping], StateRule]] = {
    "Adam": _adam,
    "AdamW": _adam,
    "NAdam": lambda g: StateRule(2, 2, "exp_avg, exp_avg_sq"),
    "RAdam": lambda g: StateRule(2, 1, "exp_avg, exp_avg_sq"),
    "Adamax": lambda g: StateRule(2, 1, "exp_avg, exp_inf"),
    "SparseAdam": lambda g: StateRule(2, 0, "exp_avg, exp_avg_sq"),
    "Adadelta": lambda g: StateRule(2, 1, "square_avg, acc_delta"),
    "Adagrad": lambda g: StateRule(1, 1, "sum"),
    "Rprop": lambda g: StateRule(2, 1, "prev, step_size"),
    "ASGD": lambda g: StateRule(1, 3, "ax"),
    "RMSprop": _rmsprop,
    "SGD": _sgd,
    "Muon": lambda g: StateRule(1, 0, "momentum_buffer"),
}


@dataclass(frozen=True)
class Estimate:
    """Bytes a training step needs; ``optimizer_state`` None when the rule is unknown."""

    model_name: str
    optimizer: str  # class name, "" without one
    weights: int
    buffers: int
    grads: int
    optimizer_state: int | None
    state_rule: str  # how the state was counted, in words
    idle_state: int  # part of it held by parameters a step skips (frozen, left inside)
    activations: int | None  # saved for backward by one forward at ``input_shape``
    input_shape: tuple[int, ...] | None
    trainable: int  # parameters (elements)
    frozen: int
    freeze_saving: int | None  # gradients + state the frozen parameters would need

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.buffers
            + self.grads
            + (self.optimizer_state or 0)
            + (self.activations or 0)
        )


def _scalar_bytes() -> int:
    """Optimizers keep ``step`` and friends as float32 (float64 when that is the default)."""
    return 8 if torch.get_default_dtype() == torch.float64 else 4


def _rule_for(cls: type[torch.optim.Optimizer]) -> Callable[[Mapping], StateRule] | None:
    for klass in cls.__mro__:  # a user subclass of AdamW keeps AdamW's state
        if klass.__module__.startswith("torch.optim") and klass.__name__ in RULES:
            return RULES[klass.__name__]
    return None


def _optimizer_class(
    spec: torch.optim.Optimizer | type[torch.optim.Optimizer] | str,
) -> type[torch.optim.Optimizer]:
    if isinstance(spec, torch.optim.Optimizer):
        return type(spec)
    if isinstance(spec, str):
        cls = getattr(torch.optim, spec, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            known = ", ".join(sorted(RULES))
            raise TorchMagicError(
                f"'{spec}' is not a torch.optim optimizer; known: {known}", param="optimizer"
            )
        return cls
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        return spec
    raise TorchMagicError(
        f"expected an optimizer, its class or name, got {type(spec).__name__}", param="optimizer"
    )


def _defaults(cls: type[torch.optim.Optimizer], options: Mapping[str, object]) -> dict:
    """The hyper-parameters a new ``cls(params, **options)`` group would have."""
    signature = inspect.signature(cls.__init__)
    found = {
        name: p.default
        for name, p in signature.parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return {**found, **options}


def _stateful(optimizer: torch.optim.Optimizer, group: Mapping) -> list[nn.Parameter]:
    """Parameters of a group a step gives state: those that get a gradient (frozen ones
    with a stale or zero ``.grad`` too). Adagrad builds state for all at construction."""
    if _rule_for(type(optimizer)) is RULES["Adagrad"]:
        return list(group["params"])
    return [p for p in group["params"] if p.requires_grad or p.grad is not None]


def _rule_bytes(rule: StateRule, params: Sequence[torch.Tensor]) -> int:
    return rule.tensors * total_bytes(params) + rule.scalars * _scalar_bytes() * len(params)


@dataclass(frozen=True)
class _State:
    bytes: int | None
    description: str
    rule: StateRule | None  # for one more parameter (the freeze saving)
    idle: int = 0  # state of parameters a step skips (frozen ones left in the optimizer)


def _state_estimate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer] | str | None,
    options: Mapping[str, object],
) -> _State:
    if optimizer is None:
        return _State(0, "no optimizer", None)
    cls = _optimizer_class(optimizer)
    rule_of = _rule_for(cls)
    if not isinstance(optimizer, torch.optim.Optimizer):
        if rule_of is None:
            return _State(None, f"unknown for {cls.__name__}: estimate with a live optimizer", None)
        rule = rule_of(_defaults(cls, options))
        trainable = [p for p in model.parameters() if p.requires_grad and not is_lazy(p)]
        return _State(_rule_bytes(rule, trainable), _describe(rule), rule)
    groups = [(g, _stateful(optimizer, g)) for g in optimizer.param_groups]
    counted = {id(p) for _, params in groups for p in params}
    idle = state_bytes(optimizer, [p for p in optimizer.state if id(p) not in counted])
    if rule_of is not None:
        total = sum(_rule_bytes(rule_of(g), params) for g, params in groups)
        rules = sorted({_describe(rule_of(g)) for g, _ in groups})
        return _State(total + idle, "; ".join(rules), rule_of(optimizer.defaults), idle)
    # not a known class: scale what the state already holds to the parameters it lacks
    have = [p for _, params in groups for p in params if optimizer.state.get(p)]
    if not have:
        return _State(
            None,
            f"unknown for {cls.__name__} until it has state: run one step, then estimate",
            None,
        )
    held = state_bytes(optimizer, have)
    ratio = held / total_bytes(have)
    lacking = [p for _, params in groups for p in params if not optimizer.state.get(p)]
    total = held + idle + round(ratio * total_bytes(lacking))
    return _State(total, f"measured: {ratio:.2f} bytes of state per parameter byte", None, idle)


def _describe(rule: StateRule) -> str:
    if not rule.tensors:
        return rule.names
    return f"{rule.tensors} per trainable parameter ({rule.names})"


def saved_activation_bytes(
    model: nn.Module, input_shape: Sequence[int], device: torch.device | None = None
) -> int:
    """Bytes of the tensors autograd saves for backward during one forward pass on a random
    input (each storage once; parameters and the input itself not counted).

    This is what a training step keeps until ``backward()``; the forward's peak is higher
    by the largest temporaries. The pass runs in the model's current train/eval mode and
    leaves no trace: buffers (BatchNorm statistics) and the RNG state are restored.
    """
    real = unwrap(model)
    device = device or reference_device(real) or torch.device("cpu")
    floating = [p for p in real.parameters() if p.is_floating_point()]
    dtype = floating[0].dtype if floating else torch.get_default_dtype()
    shape = tuple(int(n) for n in input_shape)
    if not shape or any(n < 1 for n in shape):
        raise TorchMagicError(
            f"input shape must be positive sizes, got {tuple(input_shape)}", param="input_shape"
        )

    def key(t: torch.Tensor) -> tuple:
        pointer = t.untyped_storage().data_ptr()
        return (t.device, pointer) if pointer else (id(t),)  # meta tensors have no pointer

    saved: dict[tuple, int] = {}
    skip = {key(t) for t in (*real.parameters(), *real.buffers()) if not is_lazy(t)}

    def pack(t: torch.Tensor) -> torch.Tensor:
        k = key(t)
        if k not in skip:
            saved[k] = t.untyped_storage().nbytes()
        return t

    buffers = [(b, b.detach().clone()) for b in real.buffers()]
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        x = torch.randn(shape, device=device, dtype=dtype)
        skip.add(key(x))
        try:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = real(x)  # not a compiled wrapper: no compilation for a measurement
        except Exception as error:  # the user's shape does not fit the model
            raise TorchMagicError(
                f"forward on a random input of shape {shape} failed: "
                f"{type(error).__name__}: {error}",
                param="input_shape",
            ) from None
        finally:
            with torch.no_grad():
                for b, copy in buffers:
                    b.copy_(copy)
    del out
    return sum(saved.values())


def estimate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer] | str | None = None,
    input_shape: Sequence[int] | None = None,
    *,
    options: Mapping[str, object] | None = None,
    model_name: str = "model",
) -> Estimate:
    """Bytes of weights, gradients (trainable parameters) and optimizer state a training
    step will hold, plus saved activations when ``input_shape`` is given.

    ``optimizer`` is a live optimizer (its groups' hyper-parameters and members count:
    frozen parameters out of it, or without a gradient, get no state), or a class / name
    (``"AdamW"``) for one built over all trainable parameters with ``options``.
    """
    real = unwrap(model)
    params = [p for p in real.parameters() if not is_lazy(p)]  # lazy: no memory yet
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    state = _state_estimate(real, optimizer, options or {})
    frozen_bytes = total_bytes(frozen)
    saving = None
    if optimizer is None:
        saving = frozen_bytes
    elif state.rule is not None:
        saving = frozen_bytes + _rule_bytes(state.rule, frozen)
    return Estimate(
        model_name=model_name,
        optimizer="" if optimizer is None else _optimizer_class(optimizer).__name__,
        weights=total_bytes(params),
        buffers=total_bytes(real.buffers()),
        # trainable ones get one; frozen ones keep a stale one until set to None
        grads=total_bytes(trainable) + total_bytes(p.grad for p in frozen if p.grad is not None),
        optimizer_state=state.bytes,
        state_rule=state.description,
        idle_state=state.idle,
        activations=None if input_shape is None else saved_activation_bytes(real, input_shape),
        input_shape=None if input_shape is None else tuple(int(n) for n in input_shape),
        trainable=sum(p.numel() for p in trainable),
        frozen=sum(p.numel() for p in frozen),
        freeze_saving=saving,
    )
