"""Execute a notebook in a real Jupyter kernel and echo it to the terminal.

Magics only show their true behaviour inside an IPython kernel (display hooks, rich
output, the user namespace), so the demo and its test run notebooks through nbclient
and ipykernel rather than exec'ing the code. The kernel always runs this interpreter
(``sys.executable``), so a venv's packages are the ones under test, whatever kernels
happen to be registered on the machine.

A slow or busy machine must not fail a healthy run: cells have no time limit unless
``--timeout`` asks for one, and the kernel gets minutes to start. While a cell runs, the
terminal shows its progress: each cell's source as it starts, its output as it arrives,
and the lines of an in-place display (``%fit``'s progress) that changed, every few seconds.

Usage: python tools/run_notebook.py NOTEBOOK [--out EXECUTED.ipynb] [--quiet] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

KERNEL_NAME = "python3"
KERNEL_START_TIMEOUT_S = 300  # nbclient's 60 s default is too short for a loaded machine
PROGRESS_EVERY_S = 10.0  # how often an in-place display's changes are echoed


def write_kernelspec(folder: Path, env: dict[str, str] | None = None) -> None:
    """A kernelspec that launches ipykernel with the current interpreter, ``env`` added to
    the environment it inherits (the tests' kernels put this tree's torchmagic first).

    OpenMP threads that wait for work sleep instead of spinning (unless OMP_WAIT_POLICY
    is set): on a busy machine spinning threads fight the other jobs for the cores, and a
    training step of the quickstart took 11.8 s instead of 4.0 s under a load of 13 on two
    cores. On an idle machine the difference is small.
    """
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.executable})",
        "language": "python",
        "env": {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **(env or {})},
    }
    spec_dir = folder / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps(spec))


class NotebookCellError(CellExecutionError):
    """A cell raised; says which one, so a terminal user need not count cells."""

    def __init__(self, exc: CellExecutionError, cell_number: int, source: str) -> None:
        super().__init__(exc.traceback, exc.ename, exc.evalue)
        self.cell_number = cell_number
        self.source = source


class _EchoClient(NotebookClient):
    """NotebookClient that prints each code cell and its text outputs as they arrive,
    and the changed lines of in-place displays (progress) every ``PROGRESS_EVERY_S``."""

    def __init__(self, nb: nbformat.NotebookNode, stream: TextIO | None, **kw: Any) -> None:
        super().__init__(nb, **kw)
        self._stream = stream
        self._at_line_start = True
        self._shown: dict[str, str] = {}  # display id -> the text/plain last echoed
        self._last_progress = 0.0
        self._cell_numbers = {
            i: n
            for n, i in enumerate(
                (i for i, c in enumerate(nb.cells) if c.cell_type == "code"), start=1
            )
        }
        if stream is not None:
            self.on_cell_start = self._echo_source

    def _print(self, text: str) -> None:
        assert self._stream is not None
        if text:
            self._stream.write(text)
            self._stream.flush()
            self._at_line_start = text.endswith("\n")

    def _echo_source(self, cell: nbformat.NotebookNode, cell_index: int) -> None:
        if cell.cell_type != "code" or not cell.source.strip():
            return
        if not self._at_line_start:
            self._print("\n")
        header = f"--- cell {self._cell_numbers[cell_index]} "
        self._print(f"\n{header:-<72}\n{cell.source.rstrip()}\n{'-' * 72}\n")

    def process_message(
        self, msg: dict[str, Any], cell: nbformat.NotebookNode, cell_index: int
    ) -> nbformat.NotebookNode | None:
        """Echo in-place updates too; nbclient applies them without calling ``output``."""
        out = super().process_message(msg, cell, cell_index)
        if self._stream is not None and msg["msg_type"] == "update_display_data":
            self._echo_update(msg["content"])
        return out

    def _echo_update(self, content: dict[str, Any]) -> None:
        """The lines of an updated display that differ from what was last echoed of it."""
        now = time.monotonic()
        display_id = (content.get("transient") or {}).get("display_id")
        text = content.get("data", {}).get("text/plain")
        if display_id is None or text is None or now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        before = set(self._shown.get(display_id, "").splitlines())
        self._shown[display_id] = text
        changed = [line for line in text.splitlines() if line.strip() and line not in before]
        if changed:
            self._print(("" if self._at_line_start else "\n") + "\n".join(changed) + "\n")

    def output(
        self,
        outs: list[nbformat.NotebookNode],
        msg: dict[str, Any],
        display_id: str | None,
        cell_index: int,
    ) -> nbformat.NotebookNode | None:
        out = super().output(outs, msg, display_id, cell_index)
        if out is not None and self._stream is not None:
            text = _as_text(out)
            if display_id is not None:
                self._shown[display_id] = out.get("data", {}).get("text/plain", "")
            if out.get("output_type") != "stream" and not self._at_line_start:
                text = "\n" + text  # a progress line without newline must not swallow it
            self._print(text)
        return out


def _as_text(out: nbformat.NotebookNode) -> str:
    """The terminal rendering of one output: text as-is, rich data by its text/plain."""
    kind = out.get("output_type")
    if kind == "stream":
        return out.get("text", "")
    if kind in ("display_data", "execute_result"):
        data = out.get("data", {})
        if "text/plain" in data:
            return data["text/plain"].rstrip("\n") + "\n"
        return f"[{', '.join(sorted(data))}]\n"
    if kind == "error":
        return "\n".join(out.get("traceback", [])) + "\n"
    return ""


def execute_notebook(
    path: str | Path,
    out: str | Path | None = None,
    echo: bool = True,
    timeout: int | None = None,
    env: dict[str, str] | None = None,
) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel with the notebook's folder as cwd.

    ``timeout`` limits each cell (seconds); None, the default, lets a cell take as long as
    it needs, so that a loaded machine slows a run down instead of failing it. ``env`` is
    added to the environment the kernel inherits.

    Returns the executed notebook (also written to ``out`` if given, even when a cell
    fails, so the failure can be inspected). Raises ``NotebookCellError`` (a
    ``CellExecutionError``) on the first failing cell.
    """
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="tm-kernels-") as kernels:
        write_kernelspec(Path(kernels), env)
        km = AsyncKernelManager(
            kernel_name=KERNEL_NAME,
            transport="ipc",  # unix sockets in a private temp folder, not open TCP ports
            ip=str(Path(kernels) / "kernel-ipc"),
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernels]),
        )
        client = _EchoClient(
            nb,
            sys.stdout if echo else None,
            km=km,
            kernel_name=KERNEL_NAME,
            timeout=timeout,
            startup_timeout=KERNEL_START_TIMEOUT_S,
            resources={"metadata": {"path": str(path.parent)}},
        )
        try:
            client.execute(cleanup_kc=True)  # we made km, so the client must stop it
        except CellExecutionError as exc:
            failing = _failing_cell(nb)
            if failing is None:
                raise
            raise NotebookCellError(exc, *failing) from None
        finally:
            if out is not None:
                out = Path(out)
                out.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, out)
    return nb


def _failing_cell(nb: nbformat.NotebookNode) -> tuple[int, str] | None:
    """(code cell number, source) of the first cell with an error output."""
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    for n, cell in enumerate(code_cells, start=1):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return n, cell.source
    return None


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit status 1 when a cell raises."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, help="where to write the executed notebook")
    parser.add_argument("--quiet", action="store_true", help="do not echo cells")
    parser.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="fail a cell after this many seconds (default: no limit)",
    )
    args = parser.parse_args(argv)
    failed = f"\n{'=' * 72}\nFAILED: {args.notebook}"
    try:
        execute_notebook(args.notebook, args.out, echo=not args.quiet, timeout=args.timeout)
    except NotebookCellError as exc:
        print(f"{failed}, cell {exc.cell_number}:\n{exc.source}\n", file=sys.stderr)
        print(f"{exc.ename}: {exc.evalue}", file=sys.stderr)
        return 1
    except CellExecutionError as exc:  # an error without an error output: show it all
        print(f"{failed}\n{exc}", file=sys.stderr)
        return 1
    except (CellTimeoutError, DeadKernelError) as exc:
        print(f"{failed}\n{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.out:
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
