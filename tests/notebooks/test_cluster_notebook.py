"""End-to-end: examples/cluster_handover.ipynb runs in a real Jupyter kernel.

The notebook saves a session (frozen backbone, new head, LoRA adapters), exports it, makes
the export a batch job that resumes the file, runs the job in a fresh process and under
``torchrun --nproc_per_node=2`` (gloo), and writes every run's weights to build/handover.
The test reads those files itself: the job equals the notebook's own continuation bit for
bit, the ranks agree, and the adapters came back and trained while their base stayed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paths import ROOT
from real_kernel import execute_notebook

NOTEBOOK = ROOT / "examples" / "cluster_handover.ipynb"
HANDOVER = ROOT / "build" / "handover"


def _weights(name: str) -> dict[str, torch.Tensor]:
    return torch.load(HANDOVER / name, weights_only=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_handover_continues_bit_for_bit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    for old in HANDOVER.glob("*.pt"):  # a previous run's files must not pass this one
        old.unlink()

    nb = execute_notebook(NOTEBOOK, out=tmp_path / "executed.ipynb")
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors

    job = (HANDOVER / "train.py").read_text()
    assert "torchmagic.resume(" in job and "# ---- build here" in job
    assert "tm.lora(" in (HANDOVER / "session.py").read_text()  # the export kept %lora

    notebook = _weights("notebook.pt")
    single = _weights("weights-1proc-rank0.pt")
    assert notebook.keys() == single.keys()
    assert all(torch.equal(notebook[k], single[k]) for k in notebook)

    rank0, rank1 = _weights("weights-2proc-rank0.pt"), _weights("weights-2proc-rank1.pt")
    assert rank0.keys() == rank1.keys() == notebook.keys()
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)

    at_save = _weights("at_save.pt")
    adapters = [k for k in notebook if ".lora_A." in k or ".lora_B." in k]
    assert len(adapters) == 10  # A and B of the five convolutions in layer4
    base = [k for k in notebook if k.startswith("layer4") and ".base_layer." in k]
    assert base
    for weights in single, rank0:  # resumed with the adapters, which trained on
        assert all(not torch.equal(weights[k], at_save[k]) for k in adapters)
        assert all(torch.equal(weights[k], at_save[k]) for k in base)  # their base stayed
