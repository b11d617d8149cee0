"""A private JupyterLab for ui-check: 127.0.0.1, a throw-away token, settings, workspace and
kernelspec (this interpreter, the repository's src/ first), nothing that reaches the network."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_settings(settings_dir: Path, theme: str) -> None:
    """User settings for a reproducible page: the theme, every cell in the DOM, no saving,
    no news or update checks (nothing may reach the network)."""
    settings = {
        "apputils-extension/themes": {"theme": THEMES[theme]},
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        "notebook-extension/tracker": {"windowingMode": "none"},
        "docmanager-extension/plugin": {"autosave": False},
    }
    for name, values in settings.items():
        path = settings_dir / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _write_kernelspec(data_dir: Path) -> None:
    """``python3`` = this interpreter (the project venv); PYTHONPATH comes from the server."""
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (torchmagic ui-check)",
        "language": "python",
    }
    folder = data_dir / "kernels" / "python3"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec))


@dataclass(frozen=True)
class LabServer:
    """Where the private JupyterLab listens and the token that opens it."""

    url: str
    token: str

    def notebook_url(self, path: str) -> str:
        """A fresh workspace (``reset``) showing just this notebook."""
        return f"{self.url}/lab/tree/{path}?token={self.token}&reset"


@contextmanager
def jupyterlab(scratch: Path, theme: str, log: Path) -> Iterator[LabServer]:
    """A private JupyterLab serving the repository, as long as the ``with`` lasts."""
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ)
    for name in ("config", "data", "runtime", "settings", "workspaces", "checkpoints"):
        (scratch / name).mkdir()
    env.update(
        JUPYTER_CONFIG_DIR=str(scratch / "config"),
        JUPYTER_DATA_DIR=str(scratch / "data"),
        JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(scratch / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"),
        JUPYTER_PLATFORM_DIRS="1",
        JUPYTER_PREFER_ENV_PATH="0",  # our kernelspec, not the venv's own python3
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])),
        TORCH_HOME=env.get("TORCH_HOME", str(ROOT / "build" / "torch_home")),
    )
    _write_settings(scratch / "settings", theme)
    _write_kernelspec(scratch / "data")
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={ROOT}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--FileCheckpoints.root_dir={scratch / 'checkpoints'}",  # no .ipynb_checkpoints/ here
        "--LabApp.extension_manager=readonly",
        "--ServerApp.terminals_enabled=False",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers run as root
        command.append("--allow-root")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as log_file:
        server = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            lab = LabServer(f"http://127.0.0.1:{port}", token)
            _wait_for_server(server, f"{lab.url}/api/status?token={token}", log)
            yield lab
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


def _wait_for_server(server: subprocess.Popen, url: str, log: Path, limit_s: int = 180) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({server.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    raise RuntimeError(f"JupyterLab did not answer within {limit_s} s; see {log}")
