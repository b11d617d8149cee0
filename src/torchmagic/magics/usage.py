"""A magic's usage has one source: its declarations. IPython's ``@argument`` decorators,
the ``key=value`` options and the subcommand table declared beside them, and the
docstring. ``@usage`` is IPython's ``magic_arguments`` (it builds the parser from the
``@argument`` declarations below it) that also writes, at decoration time, the docstring
``%name?`` shows, from the same declarations. The manifest (tools/gen_manifest.py), the
reference's usage lines and :data:`FLAGS`, the one table from a Python parameter to the
flag typed for it, are read from them too.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from IPython.core.magic_arguments import argument, magic_arguments, real_name

from ..manifest import REFERENCE, help_text

if TYPE_CHECKING:
    from ..render import Rendered

MagicFunction = Callable[..., object]
Handler = Callable[[Any, list[str], argparse.Namespace], "Rendered"]

# Magic name → Python parameter → what the user types for it (``exclude`` → ``--except``,
# ``lr`` → ``lr=``); each magic's row is written by its ``@usage``.
FLAGS: dict[str, dict[str, str]] = {}


@dataclass(frozen=True)
class KeyOption:
    """A ``key=value`` word of a magic line (``lr=1e-4``), parsed by the grammar."""

    name: str
    usage: str  # "lr=X | lr=A:B"
    parse: Callable[[str], object]
    type: str  # as the manifest shows it: "float | float:float"
    default: str
    help: str


@dataclass(frozen=True)
class Subcommand:
    """One subcommand of a magic (``%tm undo``): the method that runs it and the words
    that may follow it. The method takes (the words after it, the parsed line)."""

    name: str  # "" for the magic alone (``%gpumem``)
    handler: Handler
    help: str
    words: str = ""  # usage of what follows: "NAME", "[MODEL]", "on|off"
    arity: tuple[int, int] = (0, 0)  # fewest and most words after it
    options: tuple[str, ...] = ()  # the magic's flags that go with it: "--tracebacks"
    required: tuple[str, ...] = ()  # those of its options it cannot run without


@dataclass(frozen=True)
class Subcommands:
    """A magic's subcommands, dispatched by their first word; ``other`` takes any other
    first word as its own argument (``%device cuda:1``)."""

    entries: tuple[Subcommand, ...]
    other: Subcommand | None = None
    by_name: dict[str, Subcommand] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {e.name: e for e in self.entries})

    @property
    def every(self) -> tuple[Subcommand, ...]:
        return (*self.entries, *([self.other] if self.other is not None else []))


def key_options(*options: KeyOption) -> Callable[[MagicFunction], MagicFunction]:
    """Declare a magic's ``key=value`` options (below ``@usage``, which reads them)."""

    def mark(func: MagicFunction) -> MagicFunction:
        func.key_options = options  # type: ignore[attr-defined]
        return func

    return mark


def subcommands(
    *entries: Subcommand, other: Subcommand | None = None
) -> Callable[[MagicFunction], MagicFunction]:
    """Declare a magic's subcommand table (below ``@usage``; dispatch reads it too)."""

    def mark(func: MagicFunction) -> MagicFunction:
        func.subcommands = Subcommands(entries, other)  # type: ignore[attr-defined]
        return func

    return mark


@dataclass(frozen=True)
class Argument:
    """One ``@argument`` declaration, as the usage reads it."""

    name: str  # a positional's name; an option's longest spelling: "--input-shape"
    spellings: tuple[str, ...]  # every option string ("--input-shape", "--input-size")
    dest: str  # the Python parameter it fills
    switch: bool  # ``store_true``: the option alone
    nargs: str | int | None
    metavar: str | None
    choices: tuple[str, ...] | None
    default: object
    type: str
    help: str
    required: bool

    @classmethod
    def declared(cls, declaration: argument) -> Argument:
        words, kwds = declaration.args, declaration.kwds
        spellings = tuple(w for w in words if w.startswith("-"))
        switch = kwds.get("action") == "store_true"
        name = max(spellings, key=len) if spellings else words[0]
        choices = kwds.get("choices")
        return cls(
            name=name,
            spellings=spellings,
            dest=kwds.get("dest") or name.lstrip("-").replace("-", "_"),
            switch=switch,
            nargs=kwds.get("nargs"),
            metavar=kwds.get("metavar"),
            choices=None if choices is None else tuple(choices),
            default=kwds.get("default", False if switch else None),
            type="bool" if switch else kwds.get("type", str).__name__,
            help=kwds.get("help", ""),
            required=bool(kwds.get("required")),
        )

    @property
    def positional(self) -> bool:
        return not self.spellings

    @property
    def value(self) -> str:
        """What follows the option (``N``, ``loss|acc``); a positional's own word."""
        return "|".join(self.choices) if self.choices else self.metavar or self.dest.upper()

    def usage(self, required: bool = False) -> str:
        """``--epochs N``, in brackets unless it is required (here or by a subcommand)."""
        if self.positional:
            return f"[{self.value}]" if self.nargs == "?" else self.value
        if self.switch:
            return f"[{self.name}]"
        usage = f"{self.name} {self.value}{' ...' if self.nargs == '+' else ''}"
        return usage if self.required or required else f"[{usage}]"

    def entry(self) -> dict:
        """As the manifest lists it."""
        kind = "positional" if self.positional else "flag" if self.switch else "option"
        entry: dict = {"name": self.dest if self.positional else self.name}
        if not self.positional:
            entry["dest"] = self.dest
        entry |= {"kind": kind, "type": self.type}
        if self.nargs is not None and not self.switch:
            entry["nargs"] = self.nargs
        if self.choices:
            entry["choices"] = list(self.choices)
        return entry | {"default": self.default, "help": self.help}


@dataclass(frozen=True)
class CellUsage:
    """The cell form of a line magic (``%%amp bf16``): the words after ``%%name``."""

    words: str
    example: str
    purpose: str


CELL_PREFIX = "Cell:"  # the docstring paragraph that describes the cell magic


@dataclass(frozen=True)
class Usage:
    """Everything a magic declares about how it is typed."""

    name: str
    arguments: tuple[Argument, ...]
    key_options: tuple[KeyOption, ...]
    table: Subcommands | None
    doc: str  # the docstring as written: the summary, a ``Cell:`` paragraph
    example: str
    purpose: str
    cell: CellUsage | None

    @cached_property
    def options(self) -> dict[str, Argument]:
        """Every option spelling → its declaration."""
        return {s: a for a in self.arguments for s in a.spellings}

    @cached_property
    def flags(self) -> dict[str, str]:
        """Python parameter → what the user types for it."""
        found = {a.dest: a.name for a in self.arguments if not a.positional}
        return found | {k.name: f"{k.name}=" for k in self.key_options}

    def subcommand_usage(self, entry: Subcommand) -> str:
        word = entry.name if entry.name != "*" else ""
        given = [self.options[o].usage(o in entry.required) for o in entry.options]
        return " ".join(p for p in (f"%{self.name}", word, entry.words, *given) if p)

    def line(self) -> str:
        """``%name`` and its arguments: from the declarations, or the subcommand table."""
        if self.table is None:
            positionals = [a.usage() for a in self.arguments if a.positional]
            keys = [f"[{k.usage}]" for k in self.key_options]
            options = [a.usage() for a in self.arguments if not a.positional]
            return " ".join([f"%{self.name}", *positionals, *keys, *options])
        prefix = f"%{self.name} "
        named = [e for e in self.table.entries if e.name]
        if self.table.other is not None:
            named.insert(0, self.table.other)
        body = " | ".join(self.subcommand_usage(e).removeprefix(prefix) for e in named)
        claimed = {o for e in named for o in e.options}
        rest = [a.usage() for a in self.arguments if a.spellings and a.name not in claimed]
        return " ".join([prefix + (f"[{body}]" if "" in self.table.by_name else body), *rest])

    def _summary(self, kind: str) -> str:
        """The docstring's first paragraph; for the cell magic, its ``Cell:`` paragraph."""
        paragraphs = [" ".join(p.split()) for p in self.doc.split("\n\n") if p.strip()]
        if kind == "line":
            return paragraphs[0]
        cell = next(p for p in paragraphs if p.startswith(CELL_PREFIX))
        return cell.removeprefix(CELL_PREFIX).strip()

    def entry(self, kind: str = "line") -> dict:
        """The magic as the manifest describes it (``kind="cell"``: its ``%%`` form)."""
        cell = self.cell if kind == "cell" else None
        entry = {
            "name": self.name,
            "kind": kind,
            "usage": self.line() if cell is None else f"%%{self.name} {cell.words}",
            "summary": self._summary(kind),
            "arguments": [a.entry() for a in self.arguments],
            "key_values": [
                {
                    "name": k.name,
                    "usage": k.usage,
                    "type": k.type,
                    "default": k.default,
                    "help": k.help,
                }
                for k in self.key_options
            ],
        }
        if kind == "line" and self.table is not None:
            entry["subcommands"] = [
                {"name": e.name, "usage": self.subcommand_usage(e), "help": e.help}
                for e in self.table.every
            ]
        entry["example"] = self.example if cell is None else cell.example
        entry["purpose"] = self.purpose if cell is None else cell.purpose
        entry["docs"] = f"{REFERENCE}#{self.name}"
        return entry

    def entries(self) -> list[dict]:
        return [self.entry("line"), *([self.entry("cell")] if self.cell else [])]


class usage(magic_arguments):  # a decorator, lower-case as IPython names its own
    """IPython's ``magic_arguments`` with what the help adds: one example and the magic's
    purpose in a few words (``%tm help``'s line), and the cell form if it has one.

    Put it where ``@magic_arguments()`` goes, above the ``@argument``, ``@key_options``
    and ``@subcommands`` declarations. As IPython builds the parser there, it writes the
    docstring (``%name?``) from the declarations, in the layout ``%tm help NAME`` shows,
    and the magic's row of :data:`FLAGS`. The parser takes whole option names only
    (argparse would read ``--epoch 2`` as ``--epochs 2``; refused, it gets a suggestion).
    """

    def __init__(self, example: str, purpose: str, cell: CellUsage | None = None) -> None:
        super().__init__()
        self.example, self.purpose, self.cell = example, purpose, cell

    def __call__(self, func: MagicFunction) -> MagicFunction:
        written = inspect.cleandoc(func.__doc__ or "")
        super().__call__(func)
        func.parser.allow_abbrev = False  # type: ignore[attr-defined]
        declared = reversed(func.decorators)  # type: ignore[attr-defined]
        described = Usage(
            name=real_name(func),
            arguments=tuple(Argument.declared(d) for d in declared if isinstance(d, argument)),
            key_options=getattr(func, "key_options", ()),
            table=getattr(func, "subcommands", None),
            doc=written,
            example=self.example,
            purpose=self.purpose,
            cell=self.cell,
        )
        func.usage = described  # type: ignore[attr-defined]
        FLAGS[described.name] = described.flags
        func.__doc__ = "\n\n".join(help_text(entry) for entry in described.entries())
        return func


def usage_of(magic: MagicFunction) -> Usage:
    return magic.usage  # type: ignore[attr-defined]
