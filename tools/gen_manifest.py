"""Write extension.json and the usage lines of docs/magics.md from the magics' own
declarations (magics/usage.py: their ``@argument``, ``key=value`` options, subcommand
tables, docstrings, examples), the ``TorchMagics`` traitlets (config) and
``torchmagic.__version__``.

    python tools/gen_manifest.py          # rewrite extension.json and docs/magics.md's usage lines
    python tools/gen_manifest.py --check  # exit 1 when either is out of date

tests/project/test_manifest.py fails when the committed files differ from what this writes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "extension.json"
REFERENCE_FILE = ROOT / "docs/magics.md"
sys.path.insert(0, str(ROOT / "src"))  # describe this tree's code, not an installed copy

import torchmagic  # noqa: E402
from torchmagic.magics import TOPICS, TorchMagics  # noqa: E402
from torchmagic.magics.usage import usage_of  # noqa: E402
from torchmagic.manifest import REFERENCE  # noqa: E402

DESCRIPTION = (
    "IPython magics for interactive transfer learning with PyTorch: freeze, unfreeze, "
    "replace heads, keep optimizer, schedulers and BatchNorm consistent, undo."
)
TRAIT_TYPES = {"Enum": "str", "Unicode": "str", "Float": "float", "Int": "int", "Bool": "bool"}


def config() -> list[dict]:
    out = []
    for name, trait in TorchMagics.class_traits(config=True).items():
        entry: dict = {"name": name, "type": TRAIT_TYPES[type(trait).__name__]}
        if hasattr(trait, "values"):
            entry["choices"] = list(trait.values)
        entry["default"] = trait.default_value
        entry["help"] = trait.help
        out.append(entry)
    return out


def magics() -> list[dict]:
    """Every magic's entries (a line magic, then its cell form), in the topics' order."""
    return [
        entry
        for topic in TOPICS
        for method in topic.magics["line"].values()
        for entry in usage_of(getattr(topic, method)).entries()
    ]


def build_manifest() -> dict:
    return {
        "name": "torchmagic",
        "version": torchmagic.__version__,
        "description": DESCRIPTION,
        "load": "%load_ext torchmagic",
        "unload": "%unload_ext torchmagic",
        "python_api": "torchmagic.Session",
        "documentation": REFERENCE,
        "config_class": TorchMagics.__name__,
        "config": config(),
        "magics": magics(),
    }


def render() -> str:
    return json.dumps(build_manifest(), indent=2, ensure_ascii=False) + "\n"


def heading(name: str, entries: list[dict]) -> str:
    """A magic's heading in the reference: its usage lines (the line form, and the cell
    form beside it)."""
    return "### " + " and ".join(f"`{e['usage']}`" for e in entries if e["name"] == name)


def reference(text: str) -> str:
    """docs/magics.md with each magic's heading (the line after its ``<a id="name">``
    anchor) rewritten as the usage the magic declares; the rest as it is."""
    entries = build_manifest()["magics"]
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines[:-1]):
        found = re.fullmatch(r'<a id="(\w+)"></a>\n', line)
        if found and any(e["name"] == found.group(1) for e in entries):
            lines[i + 1] = heading(found.group(1), entries) + "\n"
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args(argv)
    written = {MANIFEST: render(), REFERENCE_FILE: reference(REFERENCE_FILE.read_text())}
    stale = [path for path, text in written.items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python tools/gen_manifest.py")
        return 1 if stale else 0
    for path in stale:
        path.write_text(written[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
