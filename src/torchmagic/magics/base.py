"""What every topic's magics share: the session, parsing a line, turning the engine's
refusals into one ``UsageError`` line in magic syntax, subcommand dispatch, display.

A magic body is parse → one Session call → render. The engine names the Python parameter
at fault (``TorchMagicError(..., param="epochs")``); here that becomes the flag the user
typed (``--epochs``, ``lr=``), read from the one table of flags (``usage.FLAGS``). An
error is one line, the problem and its fix; the usage is one ``%magic?`` away, never
appended.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

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
from .spelling import magic_line
from .usage import FLAGS, MagicFunction, Subcommand, Subcommands, Usage, usage_of

if TYPE_CHECKING:
    from .. import render
    from ..render import Rendered
    from .extension import TorchMagics
else:  # drawn on first use: loading the extension does not import rich
    render = lazy_module("torchmagic.render")

# Options several magics share (one decorator object serves each of them).
OPT = argument(
    "--opt",
    dest="optimizer",
    default=None,
    metavar="NAME",
    help="the optimizer, for this command (default: the one holding what it edits)",
)
DRY_RUN = argument("--dry-run", action="store_true", help="show what would change, change nothing")


def _stray_option(
    usage: Usage, table: Subcommands, entry: Subcommand, args: argparse.Namespace
) -> str:
    """An option given that belongs to another subcommand (``%tm history --sync``), in
    words; "" when there is none. Options no subcommand claims go with every one."""
    owners = {
        o: [e.name for e in table.every if o in e.options] for e in table.every for o in e.options
    }
    for declared in usage.arguments:
        given = getattr(args, declared.dest, declared.default) != declared.default
        if given and declared.name in owners and declared.name not in entry.options:
            places = " / ".join(
                f"%{usage.name} {owner}".rstrip() for owner in owners[declared.name]
            )
            return f"{declared.name} goes with {places}"
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


def _missing_option(usage: Usage, entry: Subcommand, args: argparse.Namespace) -> str:
    """The first option the subcommand requires that the line lacks, with its value's
    name (``%gpumem batch needs --input-shape SHAPE``); "" when none is missing."""
    for option in entry.required:
        declared = usage.options[option]
        if getattr(args, declared.dest) in (None, ""):
            return f"{_head(usage.name, entry)} needs {declared.name} {declared.metavar}"
    return ""


def explain(error: TorchMagicError, magic: MagicFunction) -> str:
    """The engine's refusal in the magic's words: the commands and options it suggests
    spelled as magics (``%tm use model``, ``--opt NAME``), and the parameter at fault
    named by its flag from the table. A message about a parameter starts with its name
    (``max_steps must…``, ``optimizer=x: …``): that word becomes the flag (``--max-steps
    must…``, ``--opt x: …``); another message gets the flag in front (``--loss: …``)."""
    text = spelled(error.advice, magic_line)
    flag = FLAGS[real_name(magic)].get(error.param or "")
    if error.param is None or flag is None or flag.endswith("=") or flag in text:
        return text
    first, space, rest = text.partition(" ")
    named, equals, value = first.partition("=")
    if equals and named == error.param:
        first = flag if value == "True" else f"{flag} {value}"
    elif named.rstrip(":,;") == error.param:
        first = flag + named[len(error.param) :]
    else:
        return f"{flag}: {text}"
    return first + space + rest


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
    usage = usage_of(magic)
    # an unknown option first: ``--va`` is the problem, not the ``--val`` it leaves missing
    unknown = [w for w in words if w.startswith("--") and w.partition("=")[0] not in usage.options]
    unknown = [w for w in unknown if w != "--"]  # argparse's end of options
    if unknown:
        raise UsageError(f"unknown option {unknown[0]}{_closest_option(unknown[0], usage)}")
    try:
        return magic.parser.parse_intermixed_args(words)  # type: ignore[attr-defined]
    except UsageError as error:
        raise UsageError(argparse_problem(usage, str(error))) from None


def _closest_option(typed: str, usage: Usage) -> str:
    """``; did you mean --epochs?`` for ``--epoch`` (an abbreviation: the options it
    starts, else the closest spelling); "" when none is close."""
    word = typed.partition("=")[0]
    options = list(usage.options)
    close = [o for o in options if o.startswith(word)][:3] or difflib.get_close_matches(
        word, options, n=1
    )
    return f"; did you mean {' or '.join(close)}?" if close else ""


_INVALID = re.compile(r"argument (\S+): invalid (\w+) value: '(.*)'$")
_CHOICE = re.compile(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$")
_EXPECTED = re.compile(r"argument (\S+): expected (.*)$")
_TYPES = {"int": "a whole number", "float": "a number"}


def argparse_problem(usage: Usage, message: str) -> str:
    """argparse's refusal said the way the usage line reads: the option and what it
    takes (from its declaration), the closest real choice for a misspelt one; for words
    too many or too few, where the usage is (``%fit?``)."""
    see = f"%{usage.name}? shows the usage"
    if message.startswith("unrecognized arguments: "):
        words = message.removeprefix("unrecognized arguments: ")
        return f"unexpected {words!r}: more words than %{usage.name} takes; {see}"
    if found := _INVALID.match(message):
        option, kind, value = found.groups()
        return f"{option} takes {_TYPES.get(kind, kind)}, got '{value}'"
    if (found := _CHOICE.match(message)) and found.group(1) in usage.options:
        option, value = found.group(1), found.group(2)
        names = list(usage.options[option].choices or ())
        close = difflib.get_close_matches(value, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{option} takes {' | '.join(names)}, got '{value}'{hint}"
    if found := _EXPECTED.match(message):
        option = found.group(1)
        declared = usage.options.get(option)
        value = declared.metavar if declared is not None and declared.metavar else "a value"
        return f"{option} needs {value} after it"
    if message.startswith("the following arguments are required: "):
        missing = message.removeprefix("the following arguments are required: ").split(", ")
        by_word = {w: a for a in usage.arguments for w in (a.dest, *a.spellings)}
        spelled: list[str] = []
        for word in missing:
            metavar = by_word[word].metavar or "" if word in by_word else ""
            spelled.append(f"{word} {metavar}".strip() if word.startswith("-") else metavar or word)
        return f"missing {', '.join(spelled)}; {see}"
    return message


class TopicMagics(Magics):
    """The base of each topic's magics: they all drive the one :class:`TorchMagics`
    configurable's Session and follow its settings."""

    shell: InteractiveShell  # always given: the extension creates topics for a shell

    def __init__(self, shell, settings: TorchMagics) -> None:
        super().__init__(shell=shell)
        self.settings = settings

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
        options = {k.name: k for k in usage_of(magic).key_options}
        targets, raw = split_options(words, tuple(options))
        return targets, {key: options[key].parse(text) for key, text in raw.items()}

    def dispatch(
        self, magic: MagicFunction, words: Sequence[str], args: argparse.Namespace
    ) -> Rendered:
        """Run the subcommand that ``words`` start with, from the magic's table."""
        usage = usage_of(magic)
        table, name = usage.table, usage.name
        assert table is not None, f"%{name} declares no subcommands"
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
            or _stray_option(usage, table, entry, args)
            or _missing_option(usage, entry, args)
        )
        if problem:
            raise UsageError(problem)
        from ..render.spelling import calls_spelled  # with the render layer, on first use

        with self.refusals(magic), calls_spelled(magic_line):
            return entry.handler(self, rest, args)

    def show(self, rendered: object) -> None:
        display(rendered)
