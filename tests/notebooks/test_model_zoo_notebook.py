"""End-to-end: examples/model_zoo.ipynb runs in a real Jupyter kernel, offline.

The same three commands on a torchvision, a timm and a Hugging Face model; the kernel
shows what a user sees (rich output, names resolved in the kernel's namespace, a plain
training step after the surgery).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

pytest.importorskip("timm")
pytest.importorskip("transformers")

from paths import ROOT
from real_kernel import execute_notebook

NOTEBOOK = ROOT / "examples" / "model_zoo.ipynb"


def _plain(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)


@pytest.mark.slow
def test_model_zoo_notebook(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the kernel inherits this environment: no hub, no caches outside tmp
    for key, value in {
        "TORCH_HOME": tmp_path / "torch_home",
        "HF_HOME": tmp_path / "hf_home",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }.items():
        monkeypatch.setenv(key, str(value))
    nb = execute_notebook(NOTEBOOK, out=tmp_path / "model_zoo.ipynb")

    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert not [c.source for c in cells for o in c.outputs if o.output_type == "error"]
    magics = [c for c in cells if c.source.startswith("%") and "load_ext" not in c.source]
    commands = {c.source.split()[0] for c in magics}
    assert commands == {"%freeze", "%replace_head", "%unfreeze", "%summary", "%lora"}
    for cell in magics:
        assert len(cell.outputs) == 1, cell.source
        assert "text/html" in cell.outputs[0].get("data", {}), cell.source
        assert "\x1b[" not in _plain(cell)

    by_source = {c.source: c for c in magics}
    assert "fc: Linear 512→1000 replaced by 512→5" in _plain(by_source["%replace_head resnet 5"])
    convnext = _plain(by_source["%replace_head convnext 5"])
    assert "head.fc: Linear" in convnext and "num_classes: 1000 → 5" in convnext
    dino = _plain(by_source["%replace_head dino 5"])
    assert "classifier: Linear" in dino and "config: 1000 labels → 5" in dino
    for model, count in (("resnet", 4), ("convnext", 4), ("dino", 6)):
        assert sum(c.source.split()[1].split(".")[0] == model for c in magics) == count

    def printed(fragment: str) -> str:
        cell = next(c for c in cells if fragment in c.source)
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")

    step = printed("dino.config.num_labels")
    assert "dino.config.num_labels = 5" in step
    assert step.count("logits (4, 5)") == 3, step
    lora = _plain(next(c for c in magics if c.source.startswith("%lora")))
    assert "added LoRA adapters to" in lora and "(8 layer" not in lora
    assert "lora r=8" in _plain(next(c for c in magics if "layer.0 --depth 2" in c.source))
    trained = printed("lora step")
    assert trained.count("lora step") == 3 and "base weight unchanged: True" in trained
