"""Every Python block of README.md runs as written: one fresh kernel, the blocks in order as
a notebook's cells, offline.

The folder the notebook runs in holds what a reader's has: ``images/``, a few of
scikit-learn's digits saved as PNG files in one folder per class (examples/digits.py), and a
``TORCH_HOME`` whose hub cache holds resnet18's DEFAULT weights under torchvision's file
name, as it does after the first download (a random state dict stands in for the file).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
import torch
from torchvision.models import ResNet18_Weights, resnet18

from paths import ROOT  # noqa: E402

FENCE = re.compile(r"^```python\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def readme_blocks() -> list[str]:
    return [m["code"] for m in FENCE.finditer((ROOT / "README.md").read_text(encoding="utf-8"))]


def test_the_readme_has_its_session():
    """The blocks are found (a change of fence style would otherwise pass quietly)."""
    code = "".join(readme_blocks())
    for line in ("%load_model resnet18 --weights DEFAULT", "%load_data images/", "%fit "):
        assert line in code
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_python_block_runs_in_one_kernel(tmp_path, monkeypatch):
    checkpoints = tmp_path / "torch_home" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.manual_seed(0)
    weights = ResNet18_Weights.DEFAULT
    torch.save(resnet18().state_dict(), checkpoints / weights.url.rpartition("/")[2])
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    digits = _module("digits", ROOT / "examples" / "digits.py")
    digits.save_digit_folders(tmp_path / "images", per_class=8, digits=3)

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(code) for code in readme_blocks()]
    nbformat.write(notebook, tmp_path / "readme.ipynb")
    runner = _module("run_notebook", ROOT / "tools" / "run_notebook.py")
    ran = runner.execute_notebook(tmp_path / "readme.ipynb", echo=False)

    for cell in ran.cells:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source
        magics = [line for line in cell.source.splitlines() if line.startswith("%")]
        if any(not line.startswith("%load_ext") for line in magics):
            assert any("text/html" in o.get("data", {}) for o in cell.outputs), cell.source
