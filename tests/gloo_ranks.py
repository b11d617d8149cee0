"""The distributed tests' launcher: a test file run once per rank as a script, on gloo
over 127.0.0.1, each rank in its own process (as torchrun would start them)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import torchmagic
from paths import TESTS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(script: str, world: int, timeout_s: float, *args: str) -> None:
    """``python script RANK *args`` for every rank at once; a hang past ``timeout_s``
    or a rank that fails fails the test (with the end of that rank's output)."""
    src = str(Path(torchmagic.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "PYTHONPATH": os.pathsep.join([src, str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(rank), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=timeout_s)[0].decode() for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the {world} ranks did not finish within {timeout_s} s")
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
