"""Importing torchmagic and loading the extension pay only for what they use: no
torchvision (seconds: it pulls in torch._dynamo), no rich, no timm or transformers, and
CUDA untouched. Checked in fresh processes: this one has imported everything already."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

HEAVY = ("torchvision", "rich", "timm", "transformers", "peft", "matplotlib", "torch._dynamo")

REPORT = f"""
import json, sys
import torch
print(json.dumps({{
    "loaded": [m for m in {HEAVY!r} if m in sys.modules],
    "cuda": torch.cuda.is_initialized(),
}}))
"""


def _fresh(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + REPORT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_torchmagic_imports_no_heavy_library():
    seen = _fresh("import torchmagic\ntorchmagic.Session\n")
    assert seen == {"loaded": [], "cuda": False}


def test_load_ext_in_a_bare_shell_imports_no_heavy_library():
    seen = _fresh(
        """
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "torchmagic")
        assert "freeze" in ip.magics_manager.magics["line"]
        """
    )
    assert seen == {"loaded": [], "cuda": False}


def test_the_first_magic_loads_the_render_layer_and_surgery_needs_no_torchvision():
    """A model built without torchvision: freezing, its summary and undo draw with rich
    (loaded on first use) and still never import torchvision."""
    seen = _fresh(
        """
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "torchmagic")
        cells = [
            "import torch",
            "model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),"
            " torch.nn.Linear(4, 2))",
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
            "%freeze 0-1",
            "%summary",
            "%tm undo",
        ]
        with capture_output() as captured:
            for cell in cells:
                ip.run_cell(cell).raise_error()
        assert all("text/html" in o.data for o in captured.outputs), captured.outputs
        assert len(captured.outputs) == 3
        assert all(p.requires_grad for p in ip.user_ns["model"].parameters())
        import rich  # noqa: F401  (already imported by the render layer)
        import torchmagic
        assert callable(torchmagic.render.fits)  # the lazy layer is the package's attribute
        """
    )
    assert "rich" in seen["loaded"] and "torchvision" not in seen["loaded"]
    assert seen["cuda"] is False


def test_frozen_batchnorm_is_still_recognised_once_torchvision_defines_it():
    pytest.importorskip("torchvision")
    from torchvision.ops.misc import FrozenBatchNorm2d

    from torchmagic.core.modules import is_batchnorm
    from torchmagic.core.surgery import batchnorm

    frozen = FrozenBatchNorm2d(3)
    assert is_batchnorm(frozen) and batchnorm.mode(frozen) == "frozen"
    assert is_batchnorm(torch.nn.BatchNorm2d(3)) and not is_batchnorm(torch.nn.Linear(3, 3))
