"""The first LoRA command in a kernel without ipywidgets prints nothing of peft's: the
tqdm.auto peft imports would warn "IProgress not found" (a pink stderr block in a
notebook). Each case runs in a fresh interpreter, where peft is not imported yet, made to
look like a kernel (``ipykernel.zmqshell`` loaded) without ipywidgets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("peft")

_KERNEL_WITHOUT_WIDGETS = """
import sys, types, warnings
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
sys.modules["ipywidgets"] = None  # import fails: tqdm's IProgress is None
import IPython
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    {load}
print("WARNED" if any("IProgress" in str(w.message) for w in caught) else "QUIET")
"""


def _run(load: str) -> str:
    code = _KERNEL_WITHOUT_WIDGETS.format(load=load)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_peft_alone_warns_where_torchmagic_loading_it_does_not() -> None:
    assert _run("import peft") == "WARNED"  # the check sees the warning
    loading = "from torchmagic.core.integrations import peft; peft.load()"
    assert _run(loading) == "QUIET"
