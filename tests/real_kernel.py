"""Real ipykernels of this interpreter for the tests that need what a notebook front end
gets (display messages, complete_request, whole notebooks): one runner for all of them,
tools/run_notebook.py, the one ``make demo`` uses."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import nbformat
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

import torchmagic
from paths import ROOT


def _load_runner() -> ModuleType:
    """tools/run_notebook.py, imported by path (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "tools/run_notebook.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = _load_runner()


def kernel_env() -> dict[str, str]:
    """What a test's kernel adds to the environment it inherits: this tree's torchmagic
    first on its path, and one OpenMP thread as in the suite (see conftest.py) unless
    OMP_NUM_THREADS says otherwise."""
    src = str(Path(torchmagic.__file__).resolve().parents[1])
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def execute_notebook(path: Path, out: Path | None = None) -> nbformat.NotebookNode:
    """Every cell of ``path`` run in a fresh kernel (see ``kernel_env``), quietly; the
    executed notebook is returned, and written to ``out`` if given."""
    return runner.execute_notebook(path, out=out, echo=False, env=kernel_env())


@contextmanager
def real_kernel(specs: Path, setup: str, timeout_s: float) -> Iterator[BlockingKernelClient]:
    """A kernel started from a kernelspec written under ``specs`` (see ``kernel_env``),
    after ``setup`` ran in it; shut down on exit."""
    runner.write_kernelspec(specs, kernel_env())
    specs_found = KernelSpecManager(kernel_dirs=[str(specs)])
    manager = KernelManager(kernel_name=runner.KERNEL_NAME, kernel_spec_manager=specs_found)
    manager.start_kernel()
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout_s)
        reply = client.execute_interactive(setup, timeout=timeout_s)
        assert reply["content"]["status"] == "ok", reply["content"]
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
