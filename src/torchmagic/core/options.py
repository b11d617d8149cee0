"""What each command can be told, one frozen dataclass per command: every default is
written here once. A script passes keywords to the Session method, which builds the
options; a magic builds them from its arguments and passes ``options=``. The history's
record of a command and its replay call are derived from these objects."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, TypeVar

from .errors import TorchMagicError
from .surgery.grammar import LrSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .training.progressive import Monitor
    from .training.schedule_steps import SchedStep

Options = TypeVar("Options")


@dataclass(frozen=True)
class FreezeOptions:
    """``exclude``: targets left as they are; ``bn``: the BatchNorm policy (None: the
    session's ``bn_policy``)."""

    exclude: tuple[str, ...] = ()
    bn: str | None = None


@dataclass(frozen=True)
class UnfreezeOptions:
    """``lr``: a float, or ``(first, last)`` spread geometrically over the blocks (None:
    ``unfreeze_lr_ratio`` × the head group's lr); ``wd``: weight decay of the new groups."""

    lr: LrSpec = None
    wd: float | None = None
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplaceHeadOptions:
    """``num_classes`` (None: as many as ``labels``); ``dropout`` before the new layer;
    ``labels``: the class names, written into a Hugging Face config."""

    num_classes: int | None = None
    dropout: float | None = None
    labels: tuple[str, ...] | None = None


def class_names(labels: Sequence[str] | None) -> tuple[str, ...] | None:
    """The class names as a tuple; a bare string is refused, not read as one name per
    letter."""
    if labels is None:
        return None
    if isinstance(labels, str) or not all(isinstance(name, str) for name in labels):
        raise TorchMagicError("labels must be a list of class names (strings)", param="labels")
    return tuple(labels)


@dataclass(frozen=True)
class LoraOptions:
    """What a LoRA layer is made with, as peft's ``LoraConfig`` names it: rank ``r``,
    scale ``alpha / r`` (``alpha / sqrt(r)`` with ``use_rslora``), dropout on the input,
    and DoRA's magnitude vector with ``use_dora``; ``lr``: the adapters' group's base lr
    (None: the head group's)."""

    r: int = 8
    alpha: float = 16
    dropout: float = 0.0
    use_dora: bool = False
    use_rslora: bool = False
    lr: float | None = None

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


@dataclass(frozen=True)
class FitOptions:
    """A training run (see ``Session.fit``): its length, loss, scheduler stepping,
    gradient accumulation and clipping, progressive unfreezing (``unfreeze`` blocks,
    paced by ``every`` / ``patience`` on ``monitor``, each at ``lr_ratio`` × the one
    before), the ``metric`` names measured on the validation data after each epoch, and
    ``export``: a path the weights are written to for inference after the run."""

    epochs: int = 1
    max_steps: int | None = None
    loss: str | Callable = "cross_entropy"
    cache_features: bool = False
    sched_step: SchedStep | None = None
    unfreeze: Sequence[str] | str = ()
    every: int | None = None
    patience: int | None = None
    lr_ratio: float = 0.3
    monitor: Monitor = "loss"
    early_stop: bool = False
    keep_best: bool = False
    accumulate: int = 1
    clip: float | None = None
    metric: Sequence[str] | str = ()
    export: str | None = None


@dataclass(frozen=True)
class LrFindOptions:
    """The lr range test (see ``Session.lr_find``): from ``start`` to ``end`` over
    ``steps`` steps; ``apply`` sets the suggestion as the base lrs."""

    start: float = 1e-7
    end: float = 10.0
    steps: int = 100
    apply: bool = False
    loss: str | Callable = "cross_entropy"


@dataclass(frozen=True)
class FineTuneOptions:
    """fastai's recipe (see ``Session.fine_tune``): ``freeze_epochs`` on the head, then
    ``epochs`` on everything at ``lr`` spread from the body to the head; ``metric`` as
    in ``FitOptions``, ``keep_best`` (on ``monitor``) and ``export`` for the second run."""

    epochs: int
    freeze_epochs: int = 1
    lr: float | None = None
    loss: str | Callable = "cross_entropy"
    sched_step: SchedStep | None = None
    accumulate: int = 1
    clip: float | None = None
    schedule: str | None = None
    bn: str | None = None
    metric: Sequence[str] | str = ()
    monitor: Monitor = "loss"
    keep_best: bool = False
    export: str | None = None


def changed_fields(
    options: object, leave_out: tuple[str, ...] = ()
) -> tuple[tuple[str, object], ...]:
    """The fields of ``options`` that differ from their defaults, in their order: a
    run's keywords as its replay record spells them."""
    return tuple(
        (f.name, getattr(options, f.name))
        for f in fields(options)  # type: ignore[arg-type]
        if f.name not in leave_out and getattr(options, f.name) != f.default
    )


def given_fields(
    options: object, leave_out: tuple[str, ...] = ()
) -> tuple[tuple[str, object], ...]:
    """The fields of ``options`` that say something, in their order (None, False and an
    empty tuple say nothing): a command's keywords as its record spells them."""
    pairs = ((f.name, getattr(options, f.name)) for f in fields(options))  # type: ignore[arg-type]
    return tuple(
        (name, value)
        for name, value in pairs
        if name not in leave_out and value is not None and value is not False and value != ()
    )


def checked_options(ready: Options | None, built: Options) -> Options:
    """``ready`` (an options object a caller built) when given, else ``built`` from the
    keywords; both at once is refused, as one of them would be ignored."""
    if ready is None:
        return built
    if built != type(built)():
        raise TorchMagicError(
            "give the options as keywords or as options=, not both", param="options"
        )
    return ready
