"""Everything torchmagic remembers about the user's objects, in one place.

The engine keeps what it knows about a model, an optimizer or a scheduler either on the
object itself (as peft keeps its adapters on the model: a LoRA layer carries the
trainability of its base layer, see ``surgery.lora``) or, where an attribute would
change what the object saves or copies, here. Every map is keyed weakly by the user's
object: an entry goes when its object is collected, and nothing here keeps a model, an
optimizer or a scheduler alive. ``REGISTRY`` says how many entries each map holds
(``repr``), and :meth:`Registry.describe` what each one is.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .surgery.history import History, Record
    from .surgery.optimizer_sync import Homes


def _weak_map(maps: str, written_by: str, freed: str) -> Any:
    """A field holding a weak map, documented: what it maps, who writes it, when an
    entry is freed (said by :meth:`Registry.describe`)."""
    doc = {"maps": maps, "written by": written_by, "freed": freed}
    return field(default_factory=weakref.WeakKeyDictionary, metadata=doc)


@dataclass(eq=False)
class Registry:
    """The weak maps the engine keeps, one per fact, each documented where it is declared."""

    histories: weakref.WeakKeyDictionary[nn.Module, weakref.ReferenceType[History]] = _weak_map(
        maps="model -> the undo history that recorded a command on it, so that a second "
        "session on the model shares that history (surgery.history.history_of)",
        written_by="History.push, at each command's commit",
        freed="with the model or the history (the value is a weak reference too: the "
        "sessions using a history decide how long it lives)",
    )
    commands: weakref.WeakKeyDictionary[nn.Module, list[Record]] = _weak_map(
        maps="model -> the commands that made it what it is (every one not undone), without "
        "their undo logs, so that they outlive the session that made them: a new session "
        "on the model takes them over and its save replays them (surgery.history)",
        written_by="History.push at each commit and History.adopt; undo takes a command out",
        freed="with the model (the records hold the model and optimizer weakly)",
    )
    homes: weakref.WeakKeyDictionary[torch.optim.Optimizer, Homes] = _weak_map(
        maps="optimizer -> the home group of each of its parameters: the group it was in "
        "when first seen, or when frozen; unfreezing without an lr sends it back there",
        written_by="surgery.optimizer_sync.homes, on a command's first sight of the "
        "optimizer and at every freeze",
        freed="with the optimizer",
    )
    batchnorm_originals: weakref.WeakKeyDictionary[nn.Module, nn.BatchNorm2d] = _weak_map(
        maps="FrozenBatchNorm2d put in by the 'frozen' BatchNorm policy -> the BatchNorm2d "
        "it stands in for, so that unfreezing puts that very module back (momentum, eps, "
        "its parameters' home groups); an attribute would make it a submodule",
        written_by="surgery.batchnorm, when it swaps a BatchNorm2d out",
        freed="with the FrozenBatchNorm2d (once unfrozen or undone, it is dropped)",
    )
    timm_clocks: weakref.WeakKeyDictionary[object, int] = _weak_map(
        maps="timm scheduler -> the epoch or update count torchmagic's loop stepped it to, "
        "so that a second fit continues the schedule (timm schedulers keep no clock, and "
        "an attribute would enter their state_dict)",
        written_by="the fit loop's scheduler stepping (training.schedule_steps)",
        freed="with the scheduler",
    )

    def held(self) -> dict[str, int]:
        """How many live objects each map holds an entry for, by field name."""
        return {f.name: len(getattr(self, f.name)) for f in fields(self)}

    def describe(self) -> str:
        """One line per map: its name, how many entries it holds, what it maps, who
        writes it and when an entry is freed."""
        counts = self.held()
        return "\n".join(
            f"{f.name} ({counts[f.name]}): {f.metadata['maps']}; written by "
            f"{f.metadata['written by']}; freed {f.metadata['freed']}"
            for f in fields(self)
        )

    def __repr__(self) -> str:
        held = ", ".join(f"{name}={n}" for name, n in self.held().items())
        return f"Registry({held})"


# The one instance: the engine's only module-level map of user objects.
REGISTRY = Registry()
