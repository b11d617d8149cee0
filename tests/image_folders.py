"""Small folders of generated images for the tests of ``%load_data``: each class a folder
of PNG files with random pixels (seeded), so two files never share their bytes unless a
test copies one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from PIL import Image


def class_folders(root: Path, counts: Mapping[str, int], seed: int = 0) -> Path:
    """``root/<class>/<i>.png`` for each class and count; returns ``root``."""
    rng = np.random.default_rng(seed)
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (20 + i % 3, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root
