"""Running a model for measurement or prediction without changing it: eval mode under
``inference_mode`` with the AMP policy, and afterwards each module's own train/eval flag
and every random generator as they were."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..rng import preserved_rng
from ..training.amp import AmpController
from ..training.batch_loss import main_output
from ..training.data import call_model, split_batch, to_device
from ..training.run_guards import module_mode


@contextmanager
def frozen_state(model: nn.Module, data: object = None) -> Iterator[None]:
    """``model`` in eval mode under ``inference_mode``; its modes and every random state
    (the loader's own generator too: a shuffled loader draws from it) restored after."""
    with (
        preserved_rng([getattr(data, "generator", None)]),
        module_mode(model, training=False),
        torch.inference_mode(),
    ):
        yield


def outputs(model: nn.Module, inputs: Any, amp: AmpController) -> Any:
    """The model's main output for one batch's inputs, under the AMP policy."""
    with amp.autocast():
        return main_output(call_model(model, inputs))


def batches(
    model: nn.Module, data: Iterable, device: torch.device, amp: AmpController
) -> Iterator[tuple[Any, Any, Any]]:
    """(output, targets, inputs) for each batch of ``data``, moved to ``device``."""
    non_blocking = bool(getattr(data, "pin_memory", False)) and device.type == "cuda"
    for batch in data:
        inputs, targets = split_batch(batch, "data")
        inputs = to_device(inputs, device, non_blocking)
        targets = to_device(targets, device, non_blocking)
        yield outputs(model, inputs, amp), targets, inputs
