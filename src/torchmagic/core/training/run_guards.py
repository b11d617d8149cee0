"""What a run leaves as it found it, whichever way it ends: each module's train/eval
flag, the Ctrl-C handler, and no gradients held."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..modules import walk


@contextmanager
def module_mode(module: nn.Module, training: bool) -> Iterator[None]:
    """``module`` in train or eval mode; every submodule's own flag back afterwards."""
    flags = [(m, m.training) for m in walk(module)]
    module.train(training)
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextmanager
def ctrl_c_requests_stop(request_stop: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C calls ``request_stop`` instead of raising mid-step, so the loop stops
    between batches."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: request_stop())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def clear_grads(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    for p in model.parameters():
        p.grad = None
