"""Where the repository's parts are, for tests in any folder (one place, so a test that
moves between folders never counts parent directories again)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
