"""The extension's manifest (extension.json), shipped in the package and read at run time.

tools/gen_manifest.py writes it from the magics' parsers, subcommand tables and traitlets
config; ``%tm help`` and the usage lines of error messages read it from here.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources


@cache
def load_manifest() -> dict:
    return json.loads(resources.files(__package__).joinpath("extension.json").read_text())


def magic_entry(name: str, kind: str = "line") -> dict:
    """The manifest's entry for ``%name`` (``kind="cell"``: ``%%name``)."""
    for magic in load_manifest()["magics"]:
        if magic["name"] == name and magic["kind"] == kind:
            return magic
    raise KeyError(f"{kind} magic {name!r} is not in extension.json")


def usage(name: str, kind: str = "line") -> str:
    """The usage line of ``%name``: ``%fit [MODEL] TRAIN_LOADER [--val VAL_LOADER] …``."""
    return magic_entry(name, kind)["usage"]


def subcommand_usage(name: str, subcommand: str) -> str:
    """The usage line of one subcommand: ``%tm use NAME``."""
    for entry in magic_entry(name)["subcommands"]:
        if entry["name"] == subcommand:
            return entry["usage"]
    raise KeyError(f"%{name} has no subcommand {subcommand!r} in extension.json")
