"""Files a reader can hold: no source file of torchmagic over 700 lines (read from the
source; nothing imported but the package's location)."""

from __future__ import annotations

from pathlib import Path

import torchmagic

PACKAGE = Path(torchmagic.__file__).parent
MAX_FILE_LINES = 700


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_source_file_over_700_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_the_package_is_read() -> None:
    """The checks above see the real sources (a moved package would pass them vacuously)."""
    names = {p.name for p in _sources()}
    assert {"facade.py", "workspace.py", "fit.py"} <= names
