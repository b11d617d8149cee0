"""docs/architecture.md lists every module of the package, and only modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

import torchmagic

PACKAGE = Path(torchmagic.__file__).parent
ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"
ROW = re.compile(r"^\| `([^`]+\.py)` \| (.+) \|$")  # | `core/registry.py` | what it holds |


def _listed() -> dict[str, str]:
    """The module table's rows: path → its line."""
    rows = [ROW.match(line) for line in ARCHITECTURE.read_text().splitlines()]
    found = [(m.group(1), m.group(2).strip()) for m in rows if m]
    paths = [path for path, _ in found]
    assert len(paths) == len(set(paths)), "a module listed twice"
    return dict(found)


def _modules() -> set[str]:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}


def test_every_module_is_listed_with_a_line():
    listed = _listed()
    missing = sorted(_modules() - listed.keys())
    assert not missing, f"add to docs/architecture.md's module table: {missing}"
    assert all(listed.values())


def test_every_listed_module_exists():
    gone = sorted(_listed().keys() - _modules())
    assert not gone, f"listed in docs/architecture.md but not in the package: {gone}"


def test_the_paths_it_names_in_its_prose_exist():
    """Modules named outside the table (``core/surgery/edits.py``) exist too."""
    text = ARCHITECTURE.read_text()
    named = set(re.findall(r"`((?:core|magics|render)/[\w/]+\.py)`", text))
    assert named and not sorted(p for p in named if not (PACKAGE / p).is_file())
