"""What one training step will hold, before running it: weights, gradients of the
trainable parameters, optimizer state by optimizer class, and (optionally) the
activations backward keeps, measured on one forward pass.

So the saving of a freeze shows before a step allocates anything: frozen parameters
get no gradient and no optimizer state.
"""

from __future__ import annotations

import inspect
import math
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import TorchMagicError
from ..integrations import peft
from ..integrations.lookup import state_of
from ..meta import compute_dtype, meta_replica, refuse_lazy
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
    peak: StepPeak | None  # the whole step's peak at ``input_shape``
    trainable: int  # parameters (elements)
    frozen: int
    freeze_saving: int | None  # gradients + state the frozen parameters would need
    # with LoRA adapters: the optimizer state of full fine-tuning (every base weight
    # trained, no adapters) under the same optimizer; None without adapters or rule
    full_finetune_state: int | None = None

    @property
    def persistent(self) -> int:
        """Held from one step to the next (gradients until ``zero_grad``)."""
        return self.weights + self.buffers + self.grads + (self.optimizer_state or 0)

    @property
    def total(self) -> int:
        """Persistent bytes plus the saved activations (the step's peak is ``peak.total``)."""
        return self.persistent + (self.activations or 0)


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
    state = state_of(optimizer)
    idle = state_bytes(optimizer, [p for p in state if id(p) not in counted])
    if rule_of is not None:
        total = sum(_rule_bytes(rule_of(g), params) for g, params in groups)
        rules = sorted({_describe(rule_of(g)) for g, _ in groups})
        return _State(total + idle, "; ".join(rules), rule_of(optimizer.defaults), idle)
    # not a known class: scale what the state already holds to the parameters it lacks
    have = [p for _, params in groups for p in params if state.get(p)]
    if not have:
        return _State(
            None,
            f"unknown for {cls.__name__} until it has state: run one step, then estimate",
            None,
        )
    held = state_bytes(optimizer, have)
    ratio = held / total_bytes(have)
    lacking = [p for _, params in groups for p in params if not state.get(p)]
    total = held + idle + round(ratio * total_bytes(lacking))
    return _State(total, f"measured: {ratio:.2f} bytes of state per parameter byte", None, idle)


def full_finetune_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer] | str | None,
) -> int | None:
    """Optimizer state full fine-tuning would hold: every parameter but the LoRA
    adapters trained, under ``optimizer``'s rule. None without adapters (or a rule)."""
    adapters = {id(p) for p in peft.adapters_of(model)}
    if not adapters or optimizer is None:
        return None
    rule_of = _rule_for(_optimizer_class(optimizer))
    if rule_of is None:
        return None
    defaults = optimizer.defaults if isinstance(optimizer, torch.optim.Optimizer) else {}
    base = [p for p in model.parameters() if id(p) not in adapters]
    return _rule_bytes(rule_of(defaults), base)


def _describe(rule: StateRule) -> str:
    if not rule.tensors:
        return rule.names
    return f"{rule.tensors} per trainable parameter ({rule.names})"


# CUDA workspaces torch allocates through its caching allocator (so they show in
# max_memory_allocated): cuBLAS's per handle, and an allowance for cuDNN's convolution
# algorithms. Calibrated against real steps by bench/memory.py's GPU section.
_CUBLAS_WORKSPACE = 32 * 2**20
_CUDNN_WORKSPACE = 128 * 2**20


@dataclass(frozen=True)
class StepPeak:
    """The peak of one training step (forward, backward, optimizer step) by term, in bytes.

    Persistent: ``weights + buffers + optimizer_state`` (gradients exist from backward
    to ``zero_grad``). On top of it each phase holds:

    * forward: ``input + forward_live`` (``saved_activations`` and the live temporaries);
    * backward: ``input + backward_saved + backward_grads + activation_grads``;
    * optimizer step: ``grads + optimizer_temporaries``;

    plus ``autocast_copies`` (low-precision copies of trainable weights autocast keeps for
    the forward and backward) and, on CUDA, a ``workspace`` allowance. Activation terms are
    measured on a meta-device replica of the model (no memory, no compute, the model is not
    touched); the optimizer's temporaries by one step of a replica optimizer of the same
    class and flags (foreach / fused as they resolve on the device).
    """

    persistent: int
    grads: int
    input: int
    saved_activations: int
    forward_live: int
    backward_saved: int
    backward_grads: int
    activation_grads: int
    optimizer_temporaries: int | None
    optimizer_impl: str  # "foreach", "fused", "for-loop", "no optimizer", or why unknown
    autocast_copies: int
    workspace: int

    @property
    def phases(self) -> dict[str, int]:
        """Bytes held at each phase's own peak, persistent part included."""
        common = self.persistent + self.autocast_copies + self.workspace
        return {
            "forward": common + self.input + self.forward_live,
            "backward": common
            + self.input
            + self.backward_saved
            + self.backward_grads
            + self.activation_grads,
            "optimizer step": self.persistent
            + self.workspace
            + self.grads
            + (self.optimizer_temporaries or 0),
        }

    @property
    def phase(self) -> str:
        """The phase where the step's peak falls."""
        phases = self.phases
        return max(phases, key=phases.__getitem__)

    @property
    def total(self) -> int:
        return max(self.phases.values())


class _LiveBytes(TorchDispatchMode):
    """Bytes of the storages ops create while it is active and that are still alive, by
    kind ("activation" until marked "saved" or "grad"), with the kinds at each phase's
    highest total. Storages are keyed by identity, so views and in-place ops count once."""

    def __init__(self) -> None:
        super().__init__()
        self.size: dict[int, int] = {}
        self.kind: dict[int, str] = {}
        self.by_kind: Counter[str] = Counter()
        self.phase = ""
        self.peaks: dict[str, Counter[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage()._cdata
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:  # in-place ops and views return an input's storage
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in inputs:
                self._add(t.untyped_storage())
        return out

    def _add(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self.size:
            return
        self.size[key], self.kind[key] = storage.nbytes(), "activation"
        self.by_kind["activation"] += self.size[key]
        weakref.finalize(storage, self._free, key)
        best = self.peaks.get(self.phase)
        if best is None or self.by_kind.total() > best.total():
            self.peaks[self.phase] = Counter(self.by_kind)

    def _free(self, key: int) -> None:
        self.by_kind[self.kind.pop(key)] -= self.size.pop(key)

    def mark(self, t: torch.Tensor, kind: str) -> None:
        """``t``'s storage is of ``kind`` from now on (when this mode created it)."""
        key = t.untyped_storage()._cdata
        if self.kind.get(key) == "activation":
            self.kind[key] = kind
            self.by_kind["activation"] -= self.size[key]
            self.by_kind[kind] += self.size[key]


def _shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(n) for n in input_shape)
    if not shape or any(n < 1 for n in shape):
        raise TorchMagicError(
            f"input shape must be positive sizes, got {tuple(input_shape)}", param="input_shape"
        )
    return shape


@dataclass(frozen=True)
class _Activations:
    saved: int
    forward_live: int
    backward_saved: int
    backward_grads: int  # in the replica's dtype
    activation_grads: int


def _activation_pass(
    model: nn.Module, shape: tuple[int, ...], amp_dtype: torch.dtype | None
) -> _Activations:
    """Forward and backward of a meta replica on a random input of ``shape``, measured."""
    real_dtype = compute_dtype(model)
    replica = meta_replica(model, amp_dtype)
    tracker = _LiveBytes()
    for p in replica.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p: tracker.mark(p.grad, "grad"))
    skip = {t.untyped_storage()._cdata for t in (*replica.parameters(), *replica.buffers())}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage()._cdata not in skip:
            tracker.mark(t, "saved")
        return t

    x = torch.randn(shape, device="meta", dtype=real_dtype)
    saved = 0
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), tracker:
        tracker.phase = "forward"
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = replica(x if amp_dtype is None else x.to(amp_dtype))
        except Exception as error:  # the user's shape does not fit the model
            raise TorchMagicError(
                f"forward on a random input of shape {shape} failed: "
                f"{type(error).__name__}: {error}",
                param="input_shape",
            ) from None
        saved = tracker.by_kind["saved"]
        floats = [
            t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        if floats:
            tracker.phase = "backward"
            torch.stack([t.float().sum() for t in floats]).sum().backward()
        del out, floats
    forward = tracker.peaks.get("forward", Counter())
    backward = tracker.peaks.get("backward", Counter())
    return _Activations(
        saved=saved,
        forward_live=forward.total(),
        backward_saved=backward["saved"],
        backward_grads=backward["grad"],
        activation_grads=backward["activation"],
    )


def saved_activation_bytes(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Bytes of the tensors autograd saves for backward during one forward pass on a random
    input (each storage once; parameters and the input itself not counted), measured on a
    meta-device replica: the model, its buffers and the RNG are not touched."""
    real = unwrap(model)
    refuse_lazy(real, "the estimate")
    return _activation_pass(real, _shape(input_shape), None).saved


def _optimizer_groups(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer] | str,
    options: Mapping[str, object],
) -> tuple[type[torch.optim.Optimizer], list[dict]]:
    """(class, groups) of the optimizer a step will run: a live one's groups (stateful
    parameters only), or one group of every trainable parameter with ``options``."""
    cls = _optimizer_class(optimizer)
    if isinstance(optimizer, torch.optim.Optimizer):
        groups = []
        for group in optimizer.param_groups:
            params = _stateful(optimizer, group)  # frozen ones with a stale grad step too
            if params:
                rest = {k: v for k, v in group.items() if k not in ("params", "param_names")}
                groups.append({**rest, "params": params})
        return cls, groups
    trainable = [p for p in model.parameters() if p.requires_grad]
    return cls, [{**_defaults(cls, options), "params": trainable}] if trainable else []


def _implementation(cls: type[torch.optim.Optimizer], groups: list[dict]) -> str:
    """How torch will run the step on the parameters' device: fused, foreach or a loop."""
    if any(g.get("fused") for g in groups):
        return "fused"
    explicit = {g.get("foreach") for g in groups} - {None}
    if explicit:
        return "foreach" if True in explicit else "for-loop"
    if "foreach" not in inspect.signature(cls.__init__).parameters:
        return "for-loop"
    params = [p for g in groups for p in g["params"]]
    _, foreach = _default_to_fused_or_foreach(params, differentiable=False)
    return "foreach" if foreach else "for-loop"


def optimizer_temporaries(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer] | str | None,
    options: Mapping[str, object] | None = None,
) -> tuple[int | None, str]:
    """(bytes, implementation): what ``optimizer.step()`` allocates beyond the state and
    frees again, measured by one step of a replica optimizer on meta tensors (same class,
    hyper-parameters and foreach setting as the real step resolves to; fused kernels update
    in place: 0). ``None`` with the reason when it cannot be measured."""
    if optimizer is None:
        return 0, "no optimizer"
    cls, groups = _optimizer_groups(unwrap(model), optimizer, options or {})
    if not groups:
        return 0, "nothing to update"
    how = _implementation(cls, groups)
    if how == "fused":
        return 0, how
    replicas = []
    for group in groups:
        params = [torch.zeros(p.shape, dtype=p.dtype, device="meta") for p in group["params"]]
        for p in params:
            p.requires_grad_(True)
        extra = {"foreach": how == "foreach"} if "foreach" in group else {}
        replicas.append({**group, **extra, "params": params})
    try:
        replica = cls(replicas)  # type: ignore[call-arg]  # torch.optim classes default the rest
        for _ in range(2):  # the first step creates the state, the second is measured
            for group in replica.param_groups:
                for p in group["params"]:
                    p.grad = torch.zeros_like(p)
            tracker = _LiveBytes()
            with tracker:
                replica.step()
    except Exception as error:  # noqa: BLE001  (a class that cannot step on meta tensors)
        return None, f"unknown ({cls.__name__} on meta tensors: {type(error).__name__})"
    return tracker.peaks.get("", Counter()).total(), how


def step_peak(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer] | str | None,
    input_shape: Sequence[int],
    *,
    options: Mapping[str, object] | None = None,
    amp_dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> StepPeak:
    """The peak of one training step at ``input_shape`` (see :class:`StepPeak`).

    ``amp_dtype`` (torch.bfloat16 / torch.float16): the step runs under autocast, so
    activations and their gradients are in that dtype. ``device``: where the step runs
    (default: the model's), for the workspace allowance.
    """
    real = unwrap(model)
    refuse_lazy(real, "the estimate")
    shape = _shape(input_shape)
    est = estimate(real, optimizer, None, options=options)
    acts = _activation_pass(real, shape, amp_dtype)
    temporaries, how = optimizer_temporaries(real, optimizer, options)
    where = torch.device(device) if device is not None else reference_device(real)
    trainable = [p for p in real.parameters() if p.requires_grad]
    grad_scale = 1.0
    if amp_dtype is not None and trainable:  # replica gradients were in amp_dtype
        grad_scale = trainable[0].element_size() / torch.empty((), dtype=amp_dtype).element_size()
    convs = any(isinstance(m, nn.modules.conv._ConvNd) for m in real.modules())
    workspace = 0
    if where is not None and where.type == "cuda":
        workspace = _CUBLAS_WORKSPACE + (_CUDNN_WORKSPACE if convs else 0)
    autocast = 0
    if amp_dtype is not None:
        size = torch.empty((), dtype=amp_dtype).element_size()
        autocast = sum(p.numel() * size for p in trainable if p.is_floating_point())
    return StepPeak(
        persistent=est.weights + est.buffers + (est.optimizer_state or 0),
        grads=est.grads,
        input=math.prod(shape) * compute_dtype(real).itemsize,
        saved_activations=acts.saved,
        forward_live=acts.forward_live,
        backward_saved=acts.backward_saved,
        backward_grads=round(acts.backward_grads * grad_scale),
        activation_grads=acts.activation_grads,
        optimizer_temporaries=temporaries,
        optimizer_impl=how,
        autocast_copies=autocast,
        workspace=workspace,
    )


def estimate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer] | str | None = None,
    input_shape: Sequence[int] | None = None,
    *,
    options: Mapping[str, object] | None = None,
    model_name: str = "model",
    amp_dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Estimate:
    """Bytes of weights, gradients (trainable parameters) and optimizer state a training
    step will hold; with ``input_shape`` also the saved activations and the peak of the
    whole step (:class:`StepPeak`, under autocast in ``amp_dtype`` when given, on
    ``device``, default the model's).

    ``optimizer`` is a live optimizer (its groups' hyper-parameters and members count:
    frozen parameters out of it, or without a gradient, get no state), or a class / name
    (``"AdamW"``) for one built over all trainable parameters with ``options``. A model
    with uninitialised lazy modules is refused: only a forward pass would size them.
    """
    real = unwrap(model)
    refuse_lazy(real, "the estimate")
    params = list(real.parameters())
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    state = _state_estimate(real, optimizer, options or {})
    frozen_bytes = total_bytes(frozen)
    saving = None
    if optimizer is None:
        saving = frozen_bytes
    elif state.rule is not None:
        saving = frozen_bytes + _rule_bytes(state.rule, frozen)
    peak = None
    if input_shape is not None:
        peak = step_peak(
            real, optimizer, input_shape, options=options, amp_dtype=amp_dtype, device=device
        )
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
        activations=None if peak is None else peak.saved_activations,
        input_shape=None if input_shape is None else _shape(input_shape),
        peak=peak,
        trainable=sum(p.numel() for p in trainable),
        frozen=sum(p.numel() for p in frozen),
        freeze_saving=saving,
        full_finetune_state=full_finetune_state(real, optimizer),
    )
