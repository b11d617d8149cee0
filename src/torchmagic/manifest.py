"""The extension's manifest (extension.json), shipped in the package and read at run time."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources


@cache
def load_manifest() -> dict:
    return json.loads(resources.files(__package__).joinpath("extension.json").read_text())
