"""Tab completion for the magics, as one matcher of IPython's completer (matcher API v2).

The line is read the way each magic parses it: option names, ``--bn`` choices, subcommands
and their words come from the manifest (the one source of ``%tm help``); module paths and
variables of the right kind come from the live namespace through the engine
(:mod:`torchmagic.core.completion`). On a line of ours the matcher's answers replace
IPython's own (Python keywords, other magics, ``%%latex`` for ``%freeze la``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
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
    from ..core import Session
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
    "unfreeze": "blocks",  # layer4,layer3,…
    "weights": "weights",
}
# What each magic's positional words are, by the argument's ``dest``.
POSITIONALS = {
    "targets": "targets",  # %freeze / %unfreeze: targets, then key=value options
    "where": "target",  # %summary MODEL: a model or a path inside it
    "spec": "head",  # %replace_head [TARGET|auto] N
    "name": "zoo",  # %load_model NAME
    "names": "model_and_loader",  # %fit / %lr_find / %fine_tune [MODEL] TRAIN_LOADER
}
# What an uppercase word of a subcommand's usage stands for (``%tm use NAME``).
USAGE_WORDS = {"MODEL": "model", "NAME": "model", "LOADER": "loader", "MAGIC": "magic"}
# The files an uppercase path word of a usage takes (``%tm load PATH``): the suffixes
# listed (any file where there are none).
PATH_WORDS: dict[str, tuple[str, ...]] = {"PATH": ()}
Items = list[completion.Candidate]


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


def _usage_slots(usage: str, skip: int) -> list[tuple[list[str], bool]]:
    """The alternatives of each word a usage line takes after its first ``skip`` words,
    and whether the word may be left out: ``%amp on [auto|bf16|fp16]`` (skip 2) →
    [(["auto", "bf16", "fp16"], True)]."""
    words = _OPTION_IN_USAGE.sub("", usage).split()[skip:]
    return [(word.strip("[]").split("|"), word.startswith("[")) for word in words]


def _option_items(names: Iterable[str]) -> Items:
    return completion.tagged(names, "option")


class MagicCompleter:
    """Completes the lines of the extension's magics in ``shell``."""

    def __init__(self, shell: InteractiveShell, settings: TorchMagics) -> None:
        self.shell = shell
        self.settings = settings
        self.entries = {(m["name"], m["kind"]): m for m in load_manifest()["magics"]}

    @property
    def session(self) -> Session:
        """The extension's session, over the kernel's namespace as it is now."""
        session = self.settings.session
        session.workspace.namespace = self.shell.user_ns
        return session

    @context_matcher(identifier="torchmagic", priority=1)
    def matcher(self, context: CompletionContext) -> dict[str, object]:
        """IPython's entry point: a ``SimpleMatcherResult`` whose answers suppress the
        other matchers'; each answer's type is what it names (model, block, loader,
        option…)."""
        found = self.complete(context.text_until_cursor, first_line=context.cursor_line == 0)
        if found is None:
            return {"completions": [], "suppress": False}
        fragment, matches = found
        # IPython lets only a non-empty answer suppress the others: with nothing to offer
        # (`%tm undo `), the text typed is the one answer, and TAB changes nothing
        completions = [SimpleCompletion(m, type=m.kind) for m in matches] or [
            SimpleCompletion(fragment, type="nothing to complete")
        ]
        return {
            "completions": completions,
            "matched_fragment": fragment,
            "suppress": True,
            "ordered": True,
        }

    def complete(self, text: str, first_line: bool = True) -> tuple[str, Items] | None:
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
        return fragment, _unique(matches)[: completion.LIMIT]

    # -- what may come at the cursor -------------------------------------------------

    def _candidates(self, line: Line) -> Items:
        fragment = line.fragment
        if fragment.startswith("--") and "=" in fragment:  # `--bn=e`
            name, _, typed = fragment.partition("=")
            arg = line.option(name)
            values = self._option_values(arg, typed, line) if arg else []
            return [completion.Candidate(f"{name}={v}", v.kind) for v in values]
        if _is_option(fragment):
            return self._option_names(line)
        if line.pending is not None:
            return self._option_values(line.pending, fragment, line)
        if "subcommands" in line.entry:
            found = self._subcommand_words(line)
        else:
            found = self._positionals(line)
        # nothing more to name at the cursor: the options that may follow
        return found or (self._option_names(line) if not fragment else [])

    def _option_names(self, line: Line) -> Items:
        """The magic's options; with subcommands, those of the one chosen (its usage)."""
        names = list(line.options)
        subcommand = self._subcommand(line)
        if subcommand is not None:
            own = {o[1:-1].split()[0] for o in _OPTION_IN_USAGE.findall(subcommand["usage"])}
            names = [n for n in names if n in own]
        return _option_items(n for n in names if n.startswith(line.fragment))

    def _option_values(self, arg: dict, typed: str, line: Line) -> Items:
        if "choices" in arg:
            return completion.tagged((c for c in arg["choices"] if c.startswith(typed)), "value")
        kind = OPTION_VALUES.get(arg["dest"])
        workspace = self.session.workspace
        if kind == "target":
            return completion.target_candidates(workspace, typed, root=self._root(line))
        if kind == "blocks":  # a comma-separated list: complete its last block
            done, comma, last = typed.rpartition(",")
            found = completion.target_candidates(workspace, last, root=self._root(line))
            return [completion.Candidate(done + comma + c, c.kind) for c in found]
        if kind == "weights":
            return completion.zoo_weights(next(iter(line.positionals), ""), typed)
        if kind is None:
            return []
        return completion.variables(workspace, kind, typed)

    def _root(self, line: Line) -> str | None:
        """The model variable the command's targets already name, if any."""
        workspace = self.session.workspace
        for word in line.positionals:
            head = word.partition(".")[0]
            if workspace.module(head) is not None:
                return head
        return None

    def _positionals(self, line: Line) -> Items:
        """What the magic's positional argument takes at the cursor (``POSITIONALS``)."""
        typed, slot = line.fragment, len(line.positionals)
        if line.entry["kind"] == "cell":
            return self._usage_values(_usage_slots(line.entry["usage"], 1), [], typed)
        dests = [a["name"] for a in line.entry["arguments"] if a["kind"] == "positional"]
        kind = POSITIONALS.get(dests[0]) if dests else None  # None: options only
        workspace = self.session.workspace
        keys = _option_items(
            f"{k['name']}=" for k in line.entry["key_values"] if k["name"].startswith(typed)
        )
        if kind == "targets":
            targets = completion.target_candidates(workspace, typed, root=self._root(line))
            return targets + (keys if typed else [])
        if kind == "target" and slot == 0:
            return completion.target_candidates(workspace, typed)
        if kind == "head" and slot == 0:
            auto = completion.tagged(["auto"] if "auto".startswith(typed) else [], "value")
            return auto + completion.target_candidates(workspace, typed) + (keys if typed else [])
        if kind == "head":
            return keys if typed else []
        if kind == "zoo" and slot == 0:
            return completion.zoo_models(typed)
        if kind == "model_and_loader" and slot == 0:
            return completion.variables(workspace, "model", typed) + completion.variables(
                workspace, "loader", typed
            )
        if kind == "model_and_loader" and slot == 1:
            if workspace.module(line.positionals[0]) is not None:
                return completion.variables(workspace, "loader", typed)
        return []

    def _targets_and_keys(self, line: Line) -> Items:
        """Module targets, and the magic's ``key=`` options once a word is begun."""
        typed = line.fragment
        keys = _option_items(
            f"{k['name']}=" for k in line.entry["key_values"] if k["name"].startswith(typed)
        )
        targets = completion.target_candidates(self.session.workspace, typed, root=self._root(line))
        return targets + (keys if typed else [])

    # -- subcommands -----------------------------------------------------------------

    def _subcommand(self, line: Line) -> dict | None:
        """The manifest entry of the subcommand the line starts with (``*``: another
        first word, taken as the argument of the magic's catch-all subcommand)."""
        table = {s["name"]: s for s in line.entry.get("subcommands", ())}
        if not line.positionals:
            return None
        return table.get(line.positionals[0], table.get("*"))

    def _subcommand_words(self, line: Line) -> Items:
        typed = line.fragment
        subcommand = self._subcommand(line)
        entries = line.entry["subcommands"]
        if subcommand is None:  # the first word: a subcommand, or the catch-all's word
            names = [s["name"] for s in entries if s["name"] not in ("", "*")]
            found = completion.tagged((n for n in names if n.startswith(typed)), "subcommand")
            catch_all = [s for s in entries if s["name"] == "*"]
            if catch_all and _takes_targets(catch_all[0]):  # `%lora blocks.*.attn.qkv`
                found += self._targets_and_keys(line)
            elif catch_all:
                found += self._usage_values(_usage_slots(catch_all[0]["usage"], 1), [], typed)
            return found
        if subcommand["name"] == "*":
            return self._targets_and_keys(line) if _takes_targets(subcommand) else []
        return self._usage_values(_usage_slots(subcommand["usage"], 2), line.positionals[1:], typed)

    def _usage_values(
        self, slots: list[tuple[list[str], bool]], done: Sequence[str], typed: str
    ) -> Items:
        """What the usage line allows after the words ``done``: its literal words, the
        variables its uppercase words stand for, the visible CUDA devices for ``cuda:N``.
        A word that may be left out (``[MODEL] LOADER``) is skipped when what was typed
        there is not one; at the cursor, the next word's values come with its own."""
        slot = 0
        for word in done:
            while slot < len(slots) and slots[slot][1] and not self._fits(slots[slot][0], word):
                slot += 1
            slot += 1
        found: Items = []
        while slot < len(slots):
            words, optional = slots[slot]
            found += self._slot_values(words, typed)
            if not optional:
                break
            slot += 1
        return found

    def _fits(self, words: list[str], typed: str) -> bool:
        """``typed`` is one of a slot's words (a model variable for ``MODEL``)."""
        return any(str(c) == typed for c in self._slot_values(words, typed))

    def _slot_values(self, words: list[str], typed: str) -> Items:
        found: Items = []
        for word in words:
            if word == "cuda:N":
                found += completion.cuda_devices()
            elif word in PATH_WORDS:
                found += completion.paths(typed, PATH_WORDS[word])
            elif word == "MAGIC":
                found += completion.tagged(_magic_names(self.entries), "magic")
            elif word in USAGE_WORDS:
                found += completion.variables(self.session.workspace, USAGE_WORDS[word], "")
            elif word.islower():
                found.append(completion.Candidate(word, "value"))
        return [w for w in found if w.startswith(typed)]


def _magic_names(entries: dict) -> list[str]:
    """``fit``, ``amp`` and ``%%amp``: what ``%tm help`` takes."""
    return [name if kind == "line" else f"%%{name}" for name, kind in entries]


def _unique(items: Items) -> Items:
    """The first of each text (a model variable offered as a model and as a loader's
    model, say)."""
    first: dict[str, completion.Candidate] = {}
    for item in items:
        first.setdefault(str(item), item)
    return list(first.values())


def register(shell: InteractiveShell, settings: TorchMagics) -> MagicCompleter:
    """Add the magics' matcher to the shell's completer (``%load_ext``)."""
    completer = MagicCompleter(shell, settings)
    shell.Completer.custom_matchers.append(completer.matcher)
    return completer


def unregister(shell: InteractiveShell, completer: MagicCompleter) -> None:
    """Take it out again (``%unload_ext``)."""
    matchers = shell.Completer.custom_matchers
    matchers[:] = [m for m in matchers if getattr(m, "__self__", None) is not completer]


def _takes_targets(subcommand: dict) -> bool:
    """Whether a subcommand's first word is module targets (``%lora TARGETS …``)."""
    slots = _usage_slots(subcommand["usage"], 1)
    return bool(slots) and slots[0][0] == ["TARGETS"]
