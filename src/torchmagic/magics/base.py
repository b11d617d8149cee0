"""What every topic's magics share: the session, parsing a line, turning the engine's
refusals into one ``UsageError`` line in magic syntax, subcommand tables, display.

A magic body is parse → one Session call → render. The engine names the Python parameter
at fault (``TorchMagicError(..., param="epochs")``); here that becomes the flag the user
typed (``--epochs``, ``lr=``), read from the magic's own parser and key options. An error
is one line, the problem and its fix; the usage is one ``%magic?`` away, never appended.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics
from IPython.core.magic_arguments import argument, real_name
from IPython.display import display
from IPython.utils.process import arg_split

from ..core import Session, TorchMagicError
from ..core.advice import spelled
from ..core.surgery.grammar import split_options
from ..lazy import lazy_module
from ..manifest import help_text, magic_entry
from .spelling import magic_line

if TYPE_CHECKING:
    from .. import render
    from ..render import Rendered
    from .extension import TorchMagics
else:  # drawn on first use: loading the extension does not import rich
    render = lazy_module("torchmagic.render")

MagicFunction = Callable[..., object]

# Options several magics share (one decorator object serves each of them).
OPT = argument(
    "--opt",
    dest="optimizer",
    default=None,
    metavar="NAME",
    help="the optimizer variable (default: the one holding the model's parameters)",
)
DRY_RUN = argument("--dry-run", action="store_true", help="show what would change, change nothing")


@dataclass(frozen=True)
class KeyOption:
    """A ``key=value`` word of a magic line (``lr=1e-4``), parsed by the grammar."""

    name: str
    usage: str  # "lr=X | lr=A:B"
    parse: Callable[[str], object]
    type: str  # as the manifest shows it: "float | float:float"
    default: str
    help: str


Handler = Callable[[Any, list[str], argparse.Namespace], "Rendered"]


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


def key_options(*options: KeyOption) -> Callable[[MagicFunction], MagicFunction]:
    """Declare a magic's ``key=value`` options (its help and the manifest read them)."""

    def mark(func: MagicFunction) -> MagicFunction:
        func.key_options = options  # type: ignore[attr-defined]
        return func

    return mark


def subcommands(
    *entries: Subcommand, other: Subcommand | None = None
) -> Callable[[MagicFunction], MagicFunction]:
    """Declare a magic's subcommand table (dispatch, usage and the manifest read it)."""

    def mark(func: MagicFunction) -> MagicFunction:
        func.subcommands = Subcommands(entries, other)  # type: ignore[attr-defined]
        return func

    return mark


def _stray_option(
    magic: MagicFunction,
    name: str,
    table: Subcommands,
    entry: Subcommand,
    args: argparse.Namespace,
) -> str:
    """An option given that belongs to another subcommand (``%tm history --sync``), in
    words; "" when there is none. Options no subcommand claims go with every one."""
    entries = [*table.entries, *([table.other] if table.other else [])]
    owners = {o: [e.name for e in entries if o in e.options] for e in entries for o in e.options}
    for action in magic.parser._actions:  # type: ignore[attr-defined]
        if not action.option_strings or getattr(args, action.dest, None) == action.default:
            continue
        option = max(action.option_strings, key=len)
        if option in owners and option not in entry.options:
            places = " / ".join(f"%{name} {owner}".rstrip() for owner in owners[option])
            return f"{option} goes with {places}"
    return ""


def _head(name: str, entry: Subcommand) -> str:
    """``%tm use``: the magic and the subcommand's word (the magic alone for ``other``)."""
    return f"%{name} {entry.name}".rstrip() if entry.name not in ("", "*") else f"%{name}"


def _arity_problem(name: str, entry: Subcommand, rest: Sequence[str]) -> str:
    """Words too few or too many after a subcommand, and what it takes; "" when right."""
    fewest, most = entry.arity
    head = _head(name, entry)
    if len(rest) < fewest:
        return f"{head} needs {entry.words}: {head} {entry.words}"
    if len(rest) > most:
        takes = entry.words or "no more words"
        return f"{head} takes {takes}, got {' '.join(rest)!r}"
    return ""


def _missing_option(
    magic: MagicFunction, name: str, entry: Subcommand, args: argparse.Namespace
) -> str:
    """The first option the subcommand requires that the line lacks, with its value's
    name (``%gpumem batch needs --input-shape SHAPE``); "" when none is missing."""
    for action in magic.parser._actions:  # type: ignore[attr-defined]
        option = max(action.option_strings, key=len, default="")
        if option in entry.required and getattr(args, action.dest) in (None, ""):
            return f"{_head(name, entry)} needs {option} {action.metavar}"
    return ""


def flags(magic: MagicFunction) -> dict[str, str]:
    """Python parameter → what the user types for it: ``exclude`` → ``--except``,
    ``lr`` → ``lr=``. Read from the magic's parser (by ``dest``) and key options."""
    found = {
        action.dest: max(action.option_strings, key=len)
        for action in magic.parser._actions  # type: ignore[attr-defined]
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    }
    found.update({k.name: f"{k.name}=" for k in getattr(magic, "key_options", ())})
    return found


def speak_flag(message: str, param: str, flag: str) -> str:
    """Say ``flag`` where the engine's ``message`` names the Python parameter: its
    keyword form (``optimizer=nope`` → ``--opt nope``), else a leading mention
    (``epochs must…`` → ``--epochs must…``), else as a prefix. ``key=value`` options
    read the same in both worlds; ``force=True`` is a switch's ``--force``."""
    if flag.endswith("=") or flag in message:
        return message
    switch = re.compile(rf"(?<![\w.-]){re.escape(param)}=True\b")
    if switch.search(message):
        return switch.sub(flag, message, count=1)
    keyword = re.compile(rf"(?<![\w.-]){re.escape(param)}=")
    if keyword.search(message):
        return keyword.sub(f"{flag} ", message, count=1)
    if re.match(rf"{re.escape(param)}\b", message):
        return flag + message[len(param) :]
    return f"{flag}: {message}"


def explain(error: TorchMagicError, magic: MagicFunction) -> str:
    """The engine's refusal in the magic's words (``optimizer=NAME`` → ``--opt NAME``,
    suggested commands as magics), the flag at fault named as the user typed it."""
    text = spelled(error.advice, magic_line)
    spoken = flags(magic)
    for param, flag in spoken.items():
        if param != error.param and not flag.endswith("="):
            text = re.sub(rf"(?<![\w.-]){re.escape(param)}=", f"{flag} ", text)
    if error.param is None:
        return text
    own = spoken.get(error.param)
    return text if own is None else speak_flag(text, error.param, own)


def strip_comment(line: str) -> str:
    """The line up to an unquoted ``#`` that starts a word, as a shell reads it: a comment
    after a magic (``%freeze layer1-3  # the stem``) is not an argument. A ``#`` inside a
    word (``labels=C#,F#``), in quotes or escaped stays."""
    quote = ""
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def parse(magic: MagicFunction, line: str) -> argparse.Namespace:
    """argparse over shell-like tokens; options and targets may be interleaved; a trailing
    ``# comment`` is dropped. A line the shell-like split cannot read (an unclosed quote, a
    trailing backslash) or argparse refuses is one ``UsageError`` line: the problem and
    its fix (``did you mean --epochs?``). Options are never abbreviated."""
    try:
        words = arg_split(strip_comment(line), posix=True)
    except ValueError as error:  # shlex: "No closing quotation", "No escaped character"
        hint = "close the quote" if "quotation" in str(error) else "escape the backslash (\\\\)"
        raise UsageError(f"cannot read the line: {str(error).lower()}; {hint}") from None
    parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
    options = [o for a in parser._actions for o in a.option_strings]
    # an unknown option first: ``--va`` is the problem, not the ``--val`` it leaves missing
    unknown = [w for w in words if w.startswith("--") and w.partition("=")[0] not in options]
    unknown = [w for w in unknown if w != "--"]  # argparse's end of options
    if unknown:
        raise UsageError(f"unknown option {unknown[0]}{_closest_option(unknown[0], options)}")
    try:
        return parser.parse_intermixed_args(words)
    except UsageError as error:
        raise UsageError(argparse_problem(parser, str(error))) from None


def _closest_option(typed: str, options: list[str]) -> str:
    """``; did you mean --epochs?`` for ``--epoch`` (an abbreviation: the options it
    starts, else the closest spelling); "" when none is close."""
    word = typed.partition("=")[0]
    close = [o for o in options if o.startswith(word)][:3] or difflib.get_close_matches(
        word, options, n=1
    )
    return f"; did you mean {' or '.join(close)}?" if close else ""


_INVALID = re.compile(r"argument (\S+): invalid (\w+) value: '(.*)'$")
_CHOICE = re.compile(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$")
_EXPECTED = re.compile(r"argument (\S+): expected (.*)$")
_TYPES = {"int": "a whole number", "float": "a number"}


def argparse_problem(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's refusal said the way the usage line reads: the option and what it
    takes, the closest real choice for a misspelt one; for words too many or too few,
    where the usage is (``%fit?``)."""
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    see = f"%{parser.prog}? shows the usage"
    if message.startswith("unrecognized arguments: "):
        words = message.removeprefix("unrecognized arguments: ")
        return f"unexpected {words!r}: more words than %{parser.prog} takes; {see}"
    if found := _INVALID.match(message):
        option, kind, value = found.groups()
        return f"{option} takes {_TYPES.get(kind, kind)}, got '{value}'"
    if found := _CHOICE.match(message):
        option, value, choices = found.groups()
        names = [c.strip(" '") for c in choices.split(",")]
        close = difflib.get_close_matches(value, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{option} takes {' | '.join(names)}, got '{value}'{hint}"
    if found := _EXPECTED.match(message):
        option = found.group(1)
        action = next((a for a in actions if option in a.option_strings), None)
        value = str(action.metavar) if action is not None and action.metavar else "a value"
        return f"{option} needs {value} after it"
    if message.startswith("the following arguments are required: "):
        missing = message.removeprefix("the following arguments are required: ").split(", ")
        spelled: list[str] = []
        for word in missing:
            action = next((a for a in actions if word in (a.dest, *a.option_strings)), None)
            metavar = str(action.metavar) if action is not None and action.metavar else ""
            spelled.append(f"{word} {metavar}".strip() if word.startswith("-") else metavar or word)
        return f"missing {', '.join(spelled)}; {see}"
    return message


class TopicMagics(Magics):
    """The base of each topic's magics: they all drive the one :class:`TorchMagics`
    configurable's Session and follow its settings."""

    shell: InteractiveShell  # always given: the extension creates topics for a shell

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every magic's parser takes whole option names only: argparse would read
        ``--epoch 2`` as ``--epochs 2``; refused, it gets the suggestion instead."""
        super().__init_subclass__(**kwargs)
        for method in vars(cls).values():
            if isinstance(getattr(method, "parser", None), argparse.ArgumentParser):
                method.parser.allow_abbrev = False

    def __init__(self, shell, settings: TorchMagics) -> None:
        super().__init__(shell=shell)
        self.settings = settings
        self._document()

    def _document(self) -> None:
        """Each magic's docstring (``%fit?``) becomes its usage from the manifest, the text
        ``%tm help fit`` shows, instead of argparse's (options first, ``::``, no defaults)."""
        table = type(self).magics  # kind → magic name → method name
        methods = {m: n for names in table.values() for n, m in names.items()}
        for method, name in methods.items():
            kinds = [k for k in ("line", "cell") if name in table[k]]
            try:
                texts = [help_text(magic_entry(name, kind)) for kind in kinds]
            except KeyError:  # a manifest not regenerated yet (test_manifest fails): argparse's
                continue
            getattr(type(self), method).__doc__ = "\n\n".join(texts)

    @property
    def session(self) -> Session:
        """The session, over the kernel's namespace as it is now (it may be replaced)."""
        session = self.settings.session
        session.workspace.namespace = self.shell.user_ns
        return session

    @property
    def width(self) -> int | None:
        """The configured width; None (from 0) follows the terminal, or 100 in a notebook."""
        return self.settings.width or None

    def close(self) -> None:
        """Unhook from the shell (``%unload_ext``); topics with hooks extend this."""

    @contextmanager
    def refusals(self, magic: MagicFunction) -> Iterator[None]:
        """The engine's refusals as exactly ``UsageError`` (IPython hides its traceback)."""
        try:
            yield
        except TorchMagicError as error:
            raise UsageError(explain(error, magic)) from None

    @contextmanager
    def interrupts(self, command: str) -> Iterator[None]:
        """A Ctrl-C still stops the cell, but once the engine has applied ``command`` (it
        is atomic: applied, and in the history, or not at all) the user is told so."""
        before = self._history_marks()
        try:
            from ..render.spelling import calls_spelled  # the render layer, on first use

            with calls_spelled(magic_line):  # what it shows names commands as magics
                yield
        except KeyboardInterrupt:
            if self._history_marks() != before:
                self.show(
                    render.render(
                        f"interrupted after {command} was applied: %tm history lists it, "
                        "%tm undo reverts it",
                        self.width,
                    )
                )
            raise

    def _history_marks(self) -> tuple[int, ...]:
        return tuple(entry.index for entry in self.session.history())

    def split(self, magic: MagicFunction, words: Sequence[str]) -> tuple[list[str], dict]:
        """Targets and the typed values of the magic's ``key=value`` options."""
        options = {k.name: k for k in getattr(magic, "key_options", ())}
        targets, raw = split_options(words, tuple(options))
        return targets, {key: options[key].parse(text) for key, text in raw.items()}

    def dispatch(
        self, magic: MagicFunction, words: Sequence[str], args: argparse.Namespace
    ) -> Rendered:
        """Run the subcommand that ``words`` start with, from the magic's table."""
        table: Subcommands = magic.subcommands  # type: ignore[attr-defined]
        name = real_name(magic)
        first, rest = (words[0], list(words[1:])) if words else ("", [])
        entry = table.by_name.get(first)
        if entry is None and first and table.other is not None:
            entry, rest = table.other, list(words)
        if entry is None and first:
            close = difflib.get_close_matches(first, [e.name for e in table.entries], n=1)
            hint = f"did you mean %{name} {close[0]}?" if close else f"%{name}? lists them"
            raise UsageError(f"unknown subcommand '{first}' of %{name}; {hint}")
        if entry is None:
            raise UsageError(f"%{name} needs a subcommand; %{name}? lists them")
        problem = (
            _arity_problem(name, entry, rest)
            or _stray_option(magic, name, table, entry, args)
            or _missing_option(magic, name, entry, args)
        )
        if problem:
            raise UsageError(problem)
        from ..render.spelling import calls_spelled  # with the render layer, on first use

        with self.refusals(magic), calls_spelled(magic_line):
            return entry.handler(self, rest, args)

    def show(self, rendered: object) -> None:
        display(rendered)
