"""The extension's manifest (extension.json), shipped in the package and read at run time,
and the layout of one magic's help text.

tools/gen_manifest.py writes the manifest from the magics' declarations (magics/usage.py)
and the traitlets config; ``%tm help`` and completion read it from here.
"""

from __future__ import annotations

import difflib
import json
import re
import textwrap
from functools import cache
from importlib import resources

from .core.errors import TorchMagicError

REPOSITORY = "https://github.com/torchmagic/torchmagic"
REFERENCE_FILE = "docs/magics.md"
# The magics reference (pyproject.toml's Documentation URL); ``#name`` is a magic's anchor.
REFERENCE = f"{REPOSITORY}/blob/main/{REFERENCE_FILE}"


@cache
def load_manifest() -> dict:
    return json.loads(resources.files(__package__).joinpath("extension.json").read_text())


def magic_entry(name: str, kind: str = "line") -> dict:
    """The manifest's entry for ``%name`` (``kind="cell"``: ``%%name``)."""
    for magic in load_manifest()["magics"]:
        if magic["name"] == name and magic["kind"] == kind:
            return magic
    raise KeyError(f"{kind} magic {name!r} is not in extension.json")


def magic_named(typed: str) -> dict:
    """The entry of the magic ``typed`` names: ``fit``, ``%fit``; ``%%amp`` for a cell
    magic. An unknown name is a ``TorchMagicError`` naming the closest."""
    kind = "cell" if typed.startswith("%%") else "line"
    name = typed.lstrip("%")
    try:
        return magic_entry(name, kind)
    except KeyError:
        names = [m["name"] for m in load_manifest()["magics"]]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise TorchMagicError(f"no magic named '{typed}'{hint}", param="words") from None


HELP_WIDTH = 80  # the lines of ``%name?``'s text (``%tm help NAME`` wraps at the output's width)
HELP_WORDS = 26  # the column of option words at most; a longer word gets a line of its own


def _usage_words(usage: str) -> list[str]:
    """A usage line's words, a bracketed group (``[--val VAL_LOADER]``) and an option with
    its value (``--epochs N``) each as one."""
    words: list[str] = []
    depth = 0
    for word in usage.split():
        if depth or (words and words[-1].startswith("--") and not word.startswith(("-", "["))):
            words[-1] += f" {word}"
        else:
            words.append(word)
        depth += word.count("[") - word.count("]")
    return words


def _default(argument: dict) -> str:
    """`` (default: 1)`` when the help does not say it already; nothing for flags and
    unset values."""
    default = argument.get("default")
    if argument["kind"] == "flag" or default in (None, [], "") or "default" in argument["help"]:
        return ""
    return f" (default: {default})"


def _wrapped(text: str, width: int, lead: str = "", indent: str = "") -> list[str]:
    """Prose in lines of at most ``width``, broken at spaces only (``--input-shape`` and
    an address stay whole)."""
    return textwrap.wrap(
        text,
        width,
        initial_indent=lead,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def help_text(entry: dict, width: int = HELP_WIDTH) -> str:
    """One magic's full usage, as ``%name?`` and ``%tm help NAME`` show it: the usage line,
    what it does, the arguments first, then the options with their defaults, one example
    and where the reference is; in lines of at most ``width``, drawn as they are (wrapped
    once, here, never again by the front end)."""
    rows: list[tuple[str, str]] = []
    if "subcommands" not in entry:
        rows += [
            (_positional_words(entry, a), a["help"])
            for a in entry["arguments"]
            if a["kind"] == "positional"
        ]
    rows += [(k["usage"], f"{k['help']} (default: {k['default']})") for k in entry["key_values"]]
    rows += [(s["usage"], s["help"]) for s in entry.get("subcommands", ())]
    options = []
    for argument in entry["arguments"]:
        if argument["kind"] != "positional":
            options.append((_option_word(entry, argument), argument["help"] + _default(argument)))
    wide = min(max((len(word) for word, _ in rows + options), default=0), HELP_WORDS, width // 3)

    def listed(title: str, pairs: list[tuple[str, str]]) -> list[str]:
        out = [f"{title}:"]
        for word, text in pairs:
            lead = f"  {word.ljust(wide)}  "
            if len(word) > wide:  # the text starts on the next line
                out += [f"  {line}" for line in _wrapped_usage(word, width - 2)]
                lead = " " * (wide + 4)
            out += _wrapped(text, width, lead, " " * len(lead))
        return [*out, ""]

    lines = [*_wrapped_usage(entry["usage"], width), "", *_wrapped(entry["summary"], width), ""]
    if rows:
        lines += listed("subcommands" if "subcommands" in entry else "arguments", rows)
    if options:
        lines += listed("options", options)
    lines += ["example:", *_wrapped(entry["example"], width, "  ", "    ")]
    if "docs" in entry:
        lines += ["", *reference_lines(entry["docs"], width)]
    return "\n".join(lines)


def reference_lines(address: str, width: int) -> list[str]:
    """Where the reference is, in lines of at most ``width``: the address whole (a link a
    terminal opens), alone on its line when it must be; where even that is too wide, the
    repository and the file, which a reader finds (an address the terminal cuts opens
    nothing)."""
    lines = _wrapped(f"reference: {address}", width)
    if all(len(line) <= width for line in lines):
        return lines
    return _wrapped(f"reference: {REPOSITORY.removeprefix('https://')}, {REFERENCE_FILE}", width)


def _wrapped_usage(line: str, width: int) -> list[str]:
    """The usage line in lines of at most ``width``, broken between its words (an
    option stays with its value, a bracketed group too while it fits on a line), the
    later lines indented under the first argument."""
    words = _usage_words(line)
    indent = " " * min(len(words[0]) + 1, width // 4)
    pieces = [p for word in words[1:] for p in _pieces(word, width - len(indent))]
    lines = [words[0]]
    for piece in pieces:
        if len(lines[-1]) + 1 + len(piece) > width and lines[-1].strip():
            lines.append(indent + piece)
        else:
            lines[-1] += f" {piece}"
    return lines


def _pieces(word: str, room: int) -> list[str]:
    """A usage word as it breaks: whole when it fits in ``room``, else its own words, an
    option still with its value (``[--input-shape N,C,H,W]``)."""
    if len(word) <= room:
        return [word]
    pieces: list[str] = []
    for part in word.split():
        joins = pieces and pieces[-1].lstrip("[").startswith("--") and part[0] not in "-[|"
        if joins and " " not in pieces[-1]:
            pieces[-1] += f" {part}"
        else:
            pieces.append(part)
    return pieces


def _positional_words(entry: dict, argument: dict) -> str:
    """How the usage line spells a positional argument (its metavar)."""
    keys = {f"[{k['usage']}]" for k in entry["key_values"]}
    words = _usage_words(entry["usage"])[1:]
    plain = [w for w in words if w not in keys and not w.strip("[]").startswith("--")]
    return " ".join(plain) if plain else argument["name"].upper()


def _option_word(entry: dict, argument: dict) -> str:
    """``--epochs N``: the option as the usage line writes it (inside a subcommand too)."""
    name = re.escape(argument["name"])
    found = re.search(rf"{name}(?= |\]|$)( [^\s\[\]|-][^\s\[\]]*)?( \.\.\.)?", entry["usage"])
    return found.group() if found else argument["name"]
