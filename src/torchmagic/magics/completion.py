"""Tab completion for the magics, as one matcher of IPython's completer (matcher API v2).

The line is read the way each magic parses it: option names, ``--bn`` choices, subcommands
and their words come from the manifest (the one source of ``%tm help``); module paths and
variables of the right kind come from the live namespace through the engine
(:mod:`torchmagic.core.completion`). On a line of ours the matcher's answers replace
IPython's own (Python keywords, other magics, ``%%latex`` for ``%freeze la``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from IPython.core.completer import (
    CompletionContext,
    SimpleCompletion,
    context_matcher,
)
from IPython.core.interactiveshell import InteractiveShell

from ..core import completion
from ..manifest import load_manifest

if TYPE_CHECKING:
    from ..core.workspace import Workspace
    from .extension import TorchMagics

# `%freeze la`, `%%amp b`, `fit x` (automagic): the escape, the magic, what follows it.
_MAGIC_LINE = re.compile(r"^\s*(%{0,2})([A-Za-z_]\w*)(\s.*)$")
_FRAGMENT = re.compile(r"\S*$")
_OPTION_IN_USAGE = re.compile(r"\[--[^\]]*\]")
# What the values of an option are, by its Python parameter (the manifest's ``dest``).
OPTION_VALUES = {
    "exclude": "target",
    "val": "loader",
    "optimizer": "optimizer",
    "loss": "loss",
    "optimizer_class": "optimizer_class",
}
# What an uppercase word of a subcommand's usage stands for (``%tm use NAME``).
USAGE_WORDS = {"MODEL": "model", "NAME": "model", "LOADER": "loader"}


@dataclass
class Line:
    """A magic line up to the cursor, read as argparse would read it."""

    entry: dict  # the magic's manifest entry
    fragment: str  # the word being typed
    positionals: list[str] = field(default_factory=list)
    values: dict[str, list[str]] = field(default_factory=dict)  # option dest → its words
    pending: dict | None = None  # the option whose value comes next

    @property
    def options(self) -> dict[str, dict]:
        return {a["name"]: a for a in self.entry["arguments"] if a["kind"] != "positional"}

    def option(self, word: str) -> dict | None:
        """The option ``word`` names, exactly or as argparse's unique abbreviation."""
        options = self.options
        if word in options:
            return options[word]
        matches = [arg for name, arg in options.items() if name.startswith(word)]
        return matches[0] if len(matches) == 1 else None


def read_line(entry: dict, words: Sequence[str], fragment: str) -> Line:
    """Sort the finished words into positionals and option values."""
    line = Line(entry, fragment)
    for word in words:
        if _is_option(word):
            arg = line.option(word.partition("=")[0])
            line.pending = arg if arg and arg["kind"] == "option" and "=" not in word else None
            continue
        if line.pending is not None:
            line.values.setdefault(line.pending["dest"], []).append(word)
            if line.pending.get("nargs") not in ("+", "*"):
                line.pending = None
            continue
        line.positionals.append(word)
    return line


def _is_option(word: str) -> bool:
    """``--except``, ``-`` being typed; not ``-1`` (the last child) or a range."""
    return word.startswith("-") and not word[1:2].isdigit()


def _usage_slots(usage: str, skip: int) -> list[list[str]]:
    """The alternatives of each word a usage line takes after its first ``skip`` words:
    ``%amp on [auto|bf16|fp16]`` (skip 2) → [["auto", "bf16", "fp16"]]."""
    words = _OPTION_IN_USAGE.sub("", usage).split()[skip:]
    return [word.strip("[]").split("|") for word in words]


class MagicCompleter:
    """Completes the lines of the extension's magics in ``shell``."""

    def __init__(self, shell: InteractiveShell, settings: TorchMagics) -> None:
        self.shell = shell
        self.settings = settings
        self.entries = {(m["name"], m["kind"]): m for m in load_manifest()["magics"]}

    @property
    def workspace(self) -> Workspace:
        workspace = self.settings.session.workspace
        workspace.namespace = self.shell.user_ns
        return workspace

    @context_matcher(identifier="torchmagic", priority=1)
    def matcher(self, context: CompletionContext) -> dict[str, object]:
        """IPython's entry point: a ``SimpleMatcherResult`` whose answers suppress the
        other matchers'."""
        found = self.complete(context.text_until_cursor, first_line=context.cursor_line == 0)
        if found is None:
            return {"completions": [], "suppress": False}
        fragment, matches = found
        return {
            "completions": [SimpleCompletion(m, type="torchmagic") for m in matches],
            "matched_fragment": fragment,
            "suppress": True,
            "ordered": True,
        }

    def complete(self, text: str, first_line: bool = True) -> tuple[str, list[str]] | None:
        """(the text replaced, its completions) for a line of ours up to the cursor;
        None for any other line, or while the magic's name is being typed."""
        match = _MAGIC_LINE.match(text)
        if match is None:
            return None
        escape, name, rest = match.groups()
        if escape == "%%" and not first_line:
            return None
        if not escape and (not self.shell.automagic or name in self.shell.user_ns):
            return None
        entry = self.entries.get((name, "cell" if escape == "%%" else "line"))
        if entry is None:
            return None
        fragment = _FRAGMENT.search(rest).group()  # type: ignore[union-attr]
        if fragment[:1] in ("'", '"'):
            return fragment, []
        line = read_line(entry, rest[: len(rest) - len(fragment)].split(), fragment)
        matches = self._candidates(line)
        return fragment, matches[: completion.LIMIT]

    # -- what may come at the cursor -------------------------------------------------

    def _candidates(self, line: Line) -> list[str]:
        fragment = line.fragment
        if fragment.startswith("--") and "=" in fragment:  # `--bn=e`
            name, _, typed = fragment.partition("=")
            arg = line.option(name)
            values = self._option_values(arg, typed, line) if arg else []
            return [f"{name}={value}" for value in values]
        if _is_option(fragment):
            return self._option_names(line)
        if line.pending is not None:
            return self._option_values(line.pending, fragment, line)
        if "subcommands" in line.entry:
            return self._subcommand_words(line)
        return self._positionals(line)

    def _option_names(self, line: Line) -> list[str]:
        """The magic's options; with subcommands, those of the one chosen (its usage)."""
        names = list(line.options)
        subcommand = self._subcommand(line)
        if subcommand is not None:
            own = {o[1:-1].split()[0] for o in _OPTION_IN_USAGE.findall(subcommand["usage"])}
            names = [n for n in names if n in own]
        return [n for n in names if n.startswith(line.fragment)]

    def _option_values(self, arg: dict, typed: str, line: Line) -> list[str]:
        if "choices" in arg:
            return [c for c in arg["choices"] if c.startswith(typed)]
        kind = OPTION_VALUES.get(arg["dest"])
        if kind == "target":
            return completion.target_candidates(self.workspace, typed, root=self._root(line))
        if kind is None:
            return []
        return completion.variables(self.workspace, kind, typed)

    def _root(self, line: Line) -> str | None:
        """The model variable the command's targets already name, if any."""
        workspace = self.workspace
        for word in line.positionals:
            head = word.partition(".")[0]
            if workspace.module(head) is not None:
                return head
        return None

    def _positionals(self, line: Line) -> list[str]:
        name, slot, typed = line.entry["name"], len(line.positionals), line.fragment
        workspace = self.workspace
        if line.entry["kind"] == "cell":
            return self._usage_values(_usage_slots(line.entry["usage"], 1), slot, typed)
        if name in ("freeze", "unfreeze"):
            return self._targets_and_keys(line)
        if name == "summary" and slot == 0:
            return completion.target_candidates(workspace, typed)
        if name == "replace_head" and slot == 0:
            return ["auto"][: "auto".startswith(typed)] + completion.target_candidates(
                workspace, typed
            )
        if name == "fit" and slot == 0:
            return completion.variables(workspace, "model", typed) + completion.variables(
                workspace, "loader", typed
            )
        if name == "fit" and slot == 1 and workspace.module(line.positionals[0]) is not None:
            return completion.variables(workspace, "loader", typed)
        return []

    def _targets_and_keys(self, line: Line) -> list[str]:
        """Module targets, and the magic's ``key=`` options once a word is begun."""
        typed = line.fragment
        keys = [f"{k['name']}=" for k in line.entry["key_values"]]
        targets = completion.target_candidates(self.workspace, typed, root=self._root(line))
        return targets + [k for k in keys if k.startswith(typed) and typed]

    # -- subcommands -----------------------------------------------------------------

    def _subcommand(self, line: Line) -> dict | None:
        """The manifest entry of the subcommand the line starts with (``*``: another
        first word, taken as the argument of the magic's catch-all subcommand)."""
        table = {s["name"]: s for s in line.entry.get("subcommands", ())}
        if not line.positionals:
            return None
        return table.get(line.positionals[0], table.get("*"))

    def _subcommand_words(self, line: Line) -> list[str]:
        typed = line.fragment
        subcommand = self._subcommand(line)
        entries = line.entry["subcommands"]
        if subcommand is None:  # the first word: a subcommand, or the catch-all's word
            names = [s["name"] for s in entries if s["name"] not in ("", "*")]
            catch_all = [s for s in entries if s["name"] == "*"]
            found = [n for n in names if n.startswith(typed)]
            if catch_all and _usage_slots(catch_all[0]["usage"], 1)[0] == ["TARGETS"]:
                found += self._targets_and_keys(line)  # `%lora blocks.*.attn.qkv`
            elif catch_all:
                found += self._usage_values(_usage_slots(catch_all[0]["usage"], 1), 0, typed)
            return found
        if subcommand["name"] == "*":
            takes_targets = _usage_slots(subcommand["usage"], 1)[0] == ["TARGETS"]
            return self._targets_and_keys(line) if takes_targets else []
        slots = _usage_slots(subcommand["usage"], 2)
        return self._usage_values(slots, len(line.positionals) - 1, typed)

    def _usage_values(self, slots: list[list[str]], slot: int, typed: str) -> list[str]:
        """What the usage line allows at ``slot``: its literal words, the variables its
        uppercase words stand for, the visible CUDA devices for ``cuda:N``."""
        if slot >= len(slots):
            return []
        found: list[str] = []
        for word in slots[slot]:
            if word == "cuda:N":
                found += completion.cuda_devices()
            elif word in USAGE_WORDS:
                found += completion.variables(self.workspace, USAGE_WORDS[word], "")
            elif word.islower():
                found.append(word)
        return [w for w in found if w.startswith(typed)]


def register(shell: InteractiveShell, settings: TorchMagics) -> MagicCompleter:
    """Add the magics' matcher to the shell's completer (``%load_ext``)."""
    completer = MagicCompleter(shell, settings)
    shell.Completer.custom_matchers.append(completer.matcher)
    return completer


def unregister(shell: InteractiveShell, completer: MagicCompleter) -> None:
    """Take it out again (``%unload_ext``)."""
    matchers = shell.Completer.custom_matchers
    matchers[:] = [m for m in matchers if getattr(m, "__self__", None) is not completer]
