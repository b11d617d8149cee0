"""Random state a measurement or a peek must leave as it found it.

Iterating a shuffled DataLoader draws a seed from torch's global generator, dropout and
random augmentations draw from it (and from Python's / NumPy's) on every call. A check
that runs a step or looks at a batch restores all of them, so the user's next epoch is
the one it would have been.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


@contextmanager
def preserved_rng(generators: Iterable[torch.Generator | None] = ()) -> Iterator[None]:
    """Restore torch's CPU (and, when CUDA is initialised, every GPU's), MPS, Python's
    and NumPy's global random state, and the state of ``generators``, on exit."""
    own = [g for g in generators if g is not None]
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    mps = _mps_state()
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    own_states = [g.get_state() for g in own]
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if mps is not None:
            torch.mps.set_rng_state(mps)
        random.setstate(python)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
        for g, state in zip(own, own_states, strict=True):
            g.set_state(state)


def _mps_state() -> torch.Tensor | None:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return None
    return torch.mps.get_rng_state()


def capture_rng() -> dict:
    """Every global generator's state as plain values (tensors, numbers, strings), for a
    checkpoint that ``torch.load(weights_only=True)`` reads: torch's CPU and, when CUDA is
    initialised, every GPU's; Python's; NumPy's when it is imported."""
    version, internal, gauss = random.getstate()
    state: dict = {
        "torch": torch.get_rng_state(),
        "python": (version, torch.tensor(internal, dtype=torch.int64), gauss),
    }
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    return state


def restore_rng(state: dict) -> None:
    """Put back what :func:`capture_rng` captured (GPU states when as many GPUs are here)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(v) for v in internal.tolist()), gauss))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
