"""End-to-end: ``make demo``'s notebook, the README's first session on a generated folder of
images, runs in a real Jupyter kernel.

The notebook pretrains its resnet18 stand-in once and caches it in ``build/weights`` of the
repository, shared with ``make demo``; its working folder (images, hub cache, exported
model) goes to a tmp dir here, so that nothing lands in the user's cache or in ``build/demo``.
Cells have no time limit (a loaded machine is slow, not broken); the whole test has a
generous limit of its own instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from paths import ROOT
from real_kernel import execute_notebook

NOTEBOOK = ROOT / "examples" / "own_data.ipynb"
CLASSES = ("zero", "one", "two", "three", "four")
EPOCH_ROW = re.compile(r"^\s*\d+\s+\S\s+.*?(\d+(?:\.\d+)?) ?%")  # the first % is val acc


def _plain(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)


def _last_val_accuracy(fit: nbformat.NotebookNode) -> float:
    """The last epoch's validation accuracy in percent, from %fit's epoch table."""
    rows = [m for line in _plain(fit).splitlines() if (m := EPOCH_ROW.match(line))]
    assert rows, _plain(fit)
    return float(rows[-1][1])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_own_data_walkthrough_runs_and_learns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "demo"
    monkeypatch.setenv("TORCHMAGIC_DEMO_DIR", str(work))
    nb = execute_notebook(NOTEBOOK, out=tmp_path / "own_data.ipynb")

    cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert not [c.source for c in cells for o in c.outputs if o.output_type == "error"]
    magics = [c for c in cells if c.source.startswith("%") and "load_ext" not in c.source]
    sources = [c.source for c in magics]
    for line in ("%load_model resnet18 --weights DEFAULT", "%load_data images/", "%lr_find"):
        assert any(s.startswith(line) for s in sources), sources
    for cell in magics:
        shown = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
        assert shown and all("text/html" in o.data for o in shown), cell.source

    found = _plain(next(c for c in magics if c.source.startswith("%load_data")))
    assert all(name in found for name in CLASSES), found

    fits = [c for c in magics if c.source.startswith("%fit")]
    assert len(fits) == 2
    # five classes: chance is 20 %; the frozen backbone's head alone gets well past it
    assert _last_val_accuracy(fits[0]) > 50.0, _plain(fits[0])
    assert _last_val_accuracy(fits[-1]) > 50.0, _plain(fits[-1])

    evaluation = _plain(next(c for c in magics if c.source.startswith("%evaluate")))
    assert "per class" in evaluation
    for name in CLASSES:  # a row of precision, recall and f1 for each class
        assert re.search(rf"^{name}\W+\d\.\d{{3}}\W+\d\.\d{{3}}\W+\d\.\d{{3}}", evaluation, re.M), (
            evaluation
        )

    exported = work / "model.pt2"
    assert exported.is_file() and exported.stat().st_size > 0
