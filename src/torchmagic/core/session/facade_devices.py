"""Session's device, memory and precision methods; each delegates to ``devices`` or to the
session's AMP controller."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..devices.batch_size import BatchSizeReport
from ..devices.compare import CompareReport
from ..devices.device import DeviceReport, MoveReport, list_devices, resolve_device
from ..devices.estimate import Estimate
from ..devices.memory import MemoryReport, ResetReport
from ..devices.memory import reset_peaks as reset_peak_counters
from ..devices.pinbench import PinReport
from ..devices.placement import CheckReport
from ..surgery.results import Replay
from ..training.amp import AmpStatus, cell_autocast
from . import devices, shared, training
from .part import SessionPart

if TYPE_CHECKING:
    pass


class DeviceFacade(SessionPart):
    """The devices, memory and mixed-precision part of :class:`Session`'s front door."""

    # -- devices and memory ----------------------------------------------------------

    def devices(self) -> DeviceReport:
        """Every device this process can use, with the session's marked."""
        return list_devices(self._session.device)

    def set_device(self, spec: str | torch.device) -> DeviceReport:
        """Make ``spec`` (``"cuda:1"``, ``"cpu"``, ``"mps"``, ``"auto"``) the session's
        device, where :meth:`move` sends models and :meth:`fit` expects them; returns
        the device list with it marked."""
        self._session.device = resolve_device(spec)
        return self._session.devices()

    def model_device(self, model: nn.Module) -> torch.device:
        """Where ``model``'s parameters live (the CPU for a model without any)."""
        return devices.model_device(model)

    def device_type(self, model: str | None = None) -> str:
        """The session's device type, else that of the (current) model's parameters,
        else (no model yet) that of the best device available."""
        return devices.device_type(self._session, model)

    @shared.serialised()
    def move(self, model: str | None = None) -> MoveReport:
        """Move the (current) model with its optimizer state and the GradScaler to the
        session's device (chosen automatically when none is set), keeping every
        Parameter object; that device becomes the session's."""
        return devices.move(self._session, model)

    def check(self, model: str | None = None) -> CheckReport:
        """Tensors of the (current) model, its optimizer and the GradScaler that are not
        where the model's parameters are, each with its fix; changes nothing."""
        return devices.check(self._session, model)

    def pinbench(self, loader: object) -> PinReport:
        """Time pageable against pinned host→device copies of one batch of ``loader``
        (a variable name, a DataLoader, any iterable of batches, or a batch)."""
        return devices.pinbench(self._session, loader)

    def compare_devices(
        self,
        loader: object,
        *,
        model: str | None = None,
        optimizer: str | None = None,
        loss: str | Callable = "cross_entropy",
        steps: int = 5,
    ) -> CompareReport:
        """Time a few real training steps of copies of the (current) model, with its
        optimizer's class, groups and state, on one batch of ``loader`` on the CPU and on
        every accelerator present, host→device copy included: is the GPU worth it for
        this model and batch? The live model, optimizer and RNG are left as they were."""
        return devices.compare_devices(self._session, loader, model, optimizer, loss, steps)

    def batch_size(
        self,
        input_shape: Sequence[int],
        *,
        model: str | None = None,
        optimizer: str | None = None,
        budget: int | None = None,
        max_batch: int | None = None,
        effective_batch: int | None = None,
    ) -> BatchSizeReport:
        """The largest batch of ``input_shape`` samples (no batch dimension) whose training
        step fits where the (current) model lives, under the session's AMP policy; on the
        CPU within ``budget`` bytes (default: the RAM available). State is restored.
        ``effective_batch``: the samples wanted per optimizer step; the report's
        ``accumulation`` says which ``fit(accumulate=…)`` and batch size reach it."""
        return devices.batch_size(
            self._session, input_shape, model, optimizer, budget, max_batch, effective_batch
        )

    def memory(self, model: str | None = None) -> MemoryReport:
        """Memory in use on the (current) model's device, broken down into parameters,
        gradients, optimizer state and the rest; the device figures alone when no model
        is named and none can be found."""
        return devices.memory(self._session, model)

    def reset_peaks(self, tracebacks: bool = False) -> ResetReport:
        """Start the peak-memory counters again; ``tracebacks`` also forgets the last
        traceback, whose frames can keep tensors alive."""
        return reset_peak_counters(tracebacks, self._session.workspace.namespace)

    def estimate(
        self,
        model: str | None = None,
        *,
        optimizer_class: str | type[torch.optim.Optimizer] | None = None,
        input_shape: Sequence[int] | None = None,
    ) -> Estimate:
        """Bytes a training step of the (current) model will hold: weights, gradients,
        optimizer state (its own optimizer's, or ``optimizer_class``'s such as
        ``"AdamW"``) and, given ``input_shape``, saved activations."""
        return devices.estimate(self._session, model, optimizer_class, input_shape)

    # -- mixed precision -------------------------------------------------------------

    def amp_status(self) -> AmpStatus:
        """The precision policy: off, or autocast dtype and device type, with the scaler."""
        return self._session.amp.status()

    def amp_on(self, mode: str = "auto", model: str | None = None) -> AmpStatus:
        """Autocast for training on the session's device (else the current model's):
        ``mode`` is ``"auto"`` (bf16 where supported), ``"bf16"`` or ``"fp16"`` (with a
        GradScaler)."""
        status = self._session.amp.turn_on(self._session.device_type(model), mode)
        training.record_call(self._session, None, Replay("amp_on", (), (("mode", mode),)))
        return status

    def amp_off(self) -> AmpStatus:
        """Plain precision again; an fp16 GradScaler's state is kept for next time."""
        status = self._session.amp.turn_off()
        training.record_call(self._session, None, Replay("amp_off"))
        return status

    def autocast(self, mode: str | None = None) -> AbstractContextManager:
        """``with tm.autocast():`` around forward and loss in a hand-written loop (the
        session's policy); with ``mode``, that precision for this block only, on the
        session's device type, leaving the policy as it is."""
        if mode is None:
            return self._session.amp.autocast()
        return cell_autocast(self._session.amp, mode, self._session.device_type())

    @shared.serialised()
    def step(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        *,
        accumulate: int = 1,
        clip: float | None = None,
        last: bool = False,
    ) -> bool:
        """backward, (unscale, clip) step, scaler update, zero_grad — correct under every
        precision policy; returns whether the optimizer stepped.

        ``accumulate=N``: the loss is backpropagated divided by N and the optimizer steps
        on every N-th call for it, or on a call with ``last=True`` (the epoch's last
        batch: the partial window steps). ``clip``: the largest total gradient norm of
        the optimizer's parameters, applied after unscaling. Changing either while a
        window is open is refused."""
        return training.step(self._session, loss, optimizer, accumulate, clip, last)
