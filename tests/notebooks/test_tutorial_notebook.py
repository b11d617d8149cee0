"""End-to-end: examples/gpu_and_transfer_learning.ipynb runs in a real Jupyter kernel.

The notebook makes each classic transfer-learning pitfall on purpose, lets ``%tm doctor``
catch it and fixes it. Its doctor cells carry tags in their metadata that say which check
they must show (``doctor-shows:CHECK``) or must no longer show after the fix
(``doctor-silent:CHECK``), so the prose around them can change without touching this test.

The kernel imports this tree's ``src`` (not whatever torchmagic the venv has installed) and
runs on one thread, offline (TORCH_HOME in a tmp dir).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from paths import ROOT
from real_kernel import execute_notebook

NOTEBOOK = ROOT / "examples" / "gpu_and_transfer_learning.ipynb"

# The doctor checks that name the tutorial's pitfalls, in the notebook's order: weights,
# transforms and labels that must match; unregistered tensors; BatchNorm drift; measure
# first (the loader sets the pace); the optimizer not seeing unfrozen parameters.
PITFALL_CHECKS = (
    "labels",
    "classes",
    "normalization",
    "resolution",
    "device",
    "bn-drift",
    "data-wait",
    "unoptimized",
)
# A finding's first row in the doctor's table: "warning │ bn-drift │ where │ problem".
# a finding as a table row, or as a block's first line where the table would not fit
FINDING_ROW = re.compile(r"^\s*(?:error|warning|info)\s+[│·]\s+([a-z-]+)\s+[│·]", re.M)


def _plain(cell: nbformat.NotebookNode) -> str:
    return "\n".join(
        o.get("data", {}).get("text/plain", "") or o.get("text", "") for o in cell.outputs
    )


def _magic_lines(cell: nbformat.NotebookNode) -> list[str]:
    """Unguarded magic lines (a guarded one is indented under ``if``)."""
    return [
        line
        for line in cell.source.splitlines()
        if line.startswith("%") and not line.startswith("%load_ext")
    ]


def _checks_found(cell: nbformat.NotebookNode) -> set[str]:
    return set(FINDING_ROW.findall(_plain(cell)))


def _tagged(cells: list[nbformat.NotebookNode], kind: str) -> dict[str, list[int]]:
    """check name → indices of the cells tagged ``doctor-KIND:check``."""
    found: dict[str, list[int]] = {}
    for i, cell in enumerate(cells):
        for tag in cell.metadata.get("tags", []):
            prefix, _, check = tag.partition(":")
            if prefix == f"doctor-{kind}":
                found.setdefault(check, []).append(i)
    return found


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_tutorial_catches_each_pitfall(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the kernel inherits this environment
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    nb = execute_notebook(NOTEBOOK, out=tmp_path / "tutorial.ipynb")

    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert not [c.source for c in cells for o in c.outputs if o.output_type == "error"]

    magic_cells = [c for c in cells if _magic_lines(c)]
    assert len(magic_cells) > 20
    for cell in magic_cells:
        assert any("text/html" in o.get("data", {}) for o in cell.outputs), cell.source
        assert "\x1b[" not in _plain(cell), cell.source
    # GPU-only cells are kept in the notebook, guarded, and still print something here
    guarded = [c for c in cells if "if torch.cuda.is_available():\n    %" in c.source]
    assert guarded and all(c.outputs for c in guarded)

    shows, silent = _tagged(cells, "shows"), _tagged(cells, "silent")
    assert set(shows) == set(silent) == set(PITFALL_CHECKS)
    for check in PITFALL_CHECKS:
        for i in shows[check]:
            assert check in _checks_found(cells[i]), (check, _plain(cells[i]))
            # ...and a later doctor run, after the fix, no longer names it
            assert any(j > i for j in silent[check]), check
        for j in silent[check]:
            assert "scanned:" in _plain(cells[j]), cells[j].source  # the doctor did run
            assert check not in _checks_found(cells[j]), (check, _plain(cells[j]))

    # %device check names the unregistered tensor, and no longer does once it is a buffer
    device_checks = [c for c in cells if c.source.strip() == "%device check wrapped"]
    assert len(device_checks) == 2
    first, second = (_plain(c) for c in device_checks)
    assert re.search(r"prior\s+│\s+attribute", first), first
    assert "prior" not in second and "all " in second

    fits = [c for c in cells if c.source.lstrip().startswith("%fit")]
    assert fits and all(
        "completed" in _plain(c) or "stopped: reached max_steps" in _plain(c) for c in fits
    )
    # the review answer: BatchNorm layers of frozen blocks keep their statistics in train mode
    bn_answer = next(c for c in cells if "torch.equal(before, bn.running_mean)" in c.source)
    assert _plain(bn_answer).strip() == "True"
