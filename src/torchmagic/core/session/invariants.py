"""The post-condition every command and undo ends with (docs/architecture.md, "Invariants"): every
trainable parameter of the model in exactly one group of its optimizer and no frozen one in
any, no parameter the model lost left in a group, each bound scheduler's per-group lists as
long as the groups, each EMA copy shaped like its model, LoRA layers whole and every layer's
input width as before. A command that breaks one is a torchmagic bug: it is rolled back and
said in one line, never left silently wrong.

Only what the command changed counts: a user's own setup may break these already (an
optimizer built on the head alone while the backbone still has requires_grad), so the
problems present before the command are observed first and only new ones are reported.
Cheap by design: identities, lengths and shapes, never tensor values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from ..advice import Advice, Command, as_advice
from ..ema_owners import parameter_shapes
from ..errors import TorchMagicError
from ..integrations import peft
from ..modules import unwrap, walk_model
from ..surgery.edits import BoundModel, Measured, measure
from ..surgery.scheduler_sync import mismatches

_NO_GROUP = "is trainable but in no param group"
_FROZEN = "is frozen but still in a param group"
_TWICE = "is in more than one param group"
_GONE = "left the model but is still in a param group"


class BrokenInvariant(TorchMagicError):
    """A command left the model and the objects around it inconsistent: a torchmagic bug.
    The command was rolled back before this was raised."""


@dataclass
class Observed:
    """The problems present at one moment, by a key that names the object by identity;
    ``alive`` keeps those objects alive so that no identity is reused meanwhile."""

    problems: dict[tuple, str]
    widths: tuple[dict[str, int], dict[str, int]]
    alive: list[object] = field(default_factory=list)

    def also(self, earlier: Observed) -> Observed:
        """These problems and ``earlier``'s (an undo may put back what its command fixed),
        with these widths."""
        return Observed(
            {**earlier.problems, **self.problems}, self.widths, [*self.alive, *earlier.alive]
        )


def observe(target: BoundModel, measured: Measured | None = None) -> Observed:
    """What is already wrong before a command (see the module's docstring); ``measured``:
    the model as the caller has just walked it, else it is walked here."""
    walked = measure(target, walk_model(target.model)) if measured is None else measured
    alive: list[object] = []
    problems = {
        **_group_problems(target, alive, walked.parameters),
        **_scheduler_problems(target, alive),
        **_ema_problems(target),
        **_adapter_problems(walked.modules, alive),
    }
    return Observed(problems, _widths(walked.modules), alive)


def check(
    target: BoundModel,
    before: Observed,
    command: Command,
    undone: bool = False,
    measured: Measured | None = None,
) -> None:
    """Raise :class:`BrokenInvariant` naming what ``command`` (or its undo) broke;
    ``measured``: the model as the caller has just walked it after the command."""
    after = observe(target, measured)
    new = [text for key, text in after.problems.items() if key not in before.problems]
    new += _changed_widths(before.widths, after.widths)
    if not new:
        return
    more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
    what: Advice = ("undo of ", *as_advice(command)) if undone else as_advice(command)
    outcome = (
        "the undo stays applied; clear the history before undoing further"
        if undone
        else "it was rolled back, nothing changed"
    )
    raise BrokenInvariant(
        ("torchmagic bug, please report it: ", *what, f" left {new[0]}{more}; {outcome}")
    )


def _group_problems(
    target: BoundModel, alive: list[object], parameters: Sequence[nn.Parameter]
) -> dict[tuple, str]:
    """Each trainable parameter in exactly one group of all the model's optimizers, no
    frozen one in any, none the model lost in any."""
    named = [(target.optimizer_name, target.optimizer)] if target.optimizer is not None else []
    named += [(o.name, o.optimizer) for o in target.others]
    if not named:
        return {}
    counts: dict[int, int] = {}
    held: dict[int, tuple[nn.Parameter, str]] = {}
    for opt_name, opt in named:
        for group in opt.param_groups:
            for p in group["params"]:
                counts[id(p)] = counts.get(id(p), 0) + 1
                held.setdefault(id(p), (p, opt_name or "the optimizer"))
    found: dict[tuple, tuple[nn.Parameter, str]] = {}
    for p in parameters:
        n = counts.pop(id(p), 0)
        if n > 1:
            found[(_TWICE, id(p))] = (p, _TWICE)
        elif p.requires_grad and not n:
            found[(_NO_GROUP, id(p))] = (p, _NO_GROUP)
        elif n and not p.requires_grad:
            found[(_FROZEN, id(p))] = (p, _FROZEN)
    for key in counts:  # in an optimizer, not in the model
        found[(_GONE, key)] = (held[key][0], _GONE)
    if not found:
        return {}
    alive.extend(p for p, _ in found.values())
    names = {id(p): name for name, p in target.model.named_parameters(remove_duplicate=False)}
    every = " or ".join(f"'{n}'" for n, _ in named)

    def line(p: nn.Parameter, why: str) -> str:
        where = f"'{held[id(p)][1]}'" if id(p) in held else every
        return f"parameter {names.get(id(p), f'of shape {tuple(p.shape)}')} {why} of {where}"

    return {key: line(p, why) for key, (p, why) in found.items()}


def _scheduler_problems(target: BoundModel, alive: list[object]) -> dict[tuple, str]:
    opt = target.optimizer
    if opt is None:
        return {}
    problems = {}
    for s in target.schedulers:
        for text in mismatches(s, opt):
            name = target.names.get(id(s), type(s).__name__)
            problems[("scheduler", id(s), text)] = (
                f"scheduler '{name}' out of step ({text} for {len(opt.param_groups)} param groups)"
            )
            alive.append(s)
    return problems


def _ema_problems(target: BoundModel) -> dict[tuple, str]:
    if not target.ema_copies:
        return {}
    shapes = parameter_shapes(target.model)
    return {
        ("ema", path): f"EMA copy '{path}' no longer shaped like its model"
        for path, copy in target.ema_copies
        if parameter_shapes(unwrap(copy)) != shapes
    }


def _adapter_problems(
    modules: Sequence[tuple[str, nn.Module]], alive: list[object]
) -> dict[tuple, str]:
    problems = {}
    for name, layer in ((n, m) for n, m in modules if peft.is_lora_layer(m)):
        for text in peft.broken_adapters(layer):
            problems[("adapter", id(layer), text)] = f"LoRA layer {name}: {text}"
            alive.append(layer)
    return problems


def _widths(modules: Sequence[tuple[str, nn.Module]]) -> tuple[dict[str, int], dict[str, int]]:
    """The input width of each layer by path, and of each module by the first layer inside
    it: what the layer before it writes, which no command changes (a new head reads what
    the old one read; a head now wrapped, by a LoRA layer or with dropout in front, is
    compared through the first layer inside it)."""
    own: dict[str, int] = {}
    first: dict[str, int] = {}
    waiting: list[str] = []  # the ancestors of this module with no layer inside yet
    for name, module in modules:
        # in pre-order, a module left behind has no layer after this point
        while waiting and not _inside(name, waiting[-1]):
            waiting.pop()
        value = peft.width(module, "in")
        if value is None:
            waiting.append(name)
            continue
        own[name] = value
        first[name] = value
        for ancestor in waiting:
            first[ancestor] = value
        waiting.clear()
    return own, first


def _inside(name: str, ancestor: str) -> bool:
    return not ancestor or name.startswith(ancestor + ".")


def _changed_widths(
    before: tuple[dict[str, int], dict[str, int]], after: tuple[dict[str, int], dict[str, int]]
) -> list[str]:
    own, first = after
    changed = []
    for path, value in before[0].items():
        now = own.get(path, first.get(path))
        if now is not None and now != value:
            changed.append(f"layer '{path}' reading {now} features instead of {value}")
    return changed
