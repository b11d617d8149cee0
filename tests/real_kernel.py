"""A real ipykernel of this interpreter for the tests that talk to one as a notebook
front end does (display messages, complete_request)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

import torchmagic


@contextmanager
def real_kernel(specs: Path, setup: str, timeout_s: float) -> Iterator[BlockingKernelClient]:
    """A kernel started from a kernelspec written under ``specs``, this tree's torchmagic
    first on its path, after ``setup`` ran in it; shut down on exit."""
    (specs / "python3").mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (specs / "python3" / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "torchmagic", "language": "python"})
    )
    src = str(Path(torchmagic.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    manager = KernelManager(
        kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)])
    )
    manager.start_kernel(env=env)
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
