"""End-to-end: the quickstart notebook runs in a real Jupyter kernel.

Only a kernel shows what a user sees: the magics registered by ``%load_ext``, their rich
output, names resolved in the kernel's namespace, and a plain training loop after them.

The notebook caches its pretrained weights in ``build/weights`` of the repository (the
file name encodes the pretraining settings), shared with ``make demo``, so only the first
run pays for pretraining (about half a minute of CPU time). TORCH_HOME points into a tmp
dir so that nothing can be downloaded to the user's cache.

Cells have no time limit (a loaded machine is slow, not broken); the whole notebook test
has a generous limit of its own instead of the suite's default.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import nbformat
import pytest

from paths import ROOT
from real_kernel import execute_notebook, runner

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(
        o.get("text", "")
        for o in cell.outputs
        if o.output_type == "stream" and o.get("name") == "stdout"
    )


def _is_magic(cell: nbformat.NotebookNode) -> bool:
    return cell.source.lstrip().startswith("%") and "load_ext" not in cell.source


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The kernel inherits this environment: keep torch away from ~/.cache."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    return tmp_path


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quickstart_runs_and_transfer_wins_with_few_labels(isolated_env: Path) -> None:
    out = isolated_env / "quickstart.ipynb"
    nb = execute_notebook(NOTEBOOK, out=out)
    assert out.exists()

    cells = _code_cells(nb)
    errors = [
        (n, cell.source)
        for n, cell in enumerate(cells, start=1)
        for o in cell.outputs
        if o.output_type == "error"
    ]
    assert not errors

    magic_cells = [cell for cell in cells if _is_magic(cell)]
    assert magic_cells, "the quickstart should use the magics"
    assert any("text/html" in o.get("data", {}) for cell in magic_cells for o in cell.outputs), (
        "no magic produced rich (text/html) output"
    )

    for cell in magic_cells:
        for o in cell.outputs:
            plain = o.get("data", {}).get("text/plain", "")
            assert "\x1b[" not in plain, f"terminal escapes in {cell.source!r}"
    surgery = [c for c in magic_cells if c.source.startswith(("%freeze", "%unfreeze", "%replace"))]
    assert surgery and all(len(c.outputs) == 1 for c in surgery), "one summary per command"
    fits = [c for c in magic_cells if c.source.startswith("%fit")]
    assert any("--cache-features" in c.source for c in fits)
    assert all(
        any("completed" in o.get("data", {}).get("text/plain", "") for o in c.outputs) for c in fits
    )

    table = _curve_table(cells)
    assert set(table) == {"1", "2", "5", "10", "all"}, table
    for few in ("1", "2"):  # measured 13-16 points ahead here, on AVX2 and AVX-512 kernels
        scratch, _probe, finetuned = table[few]
        assert finetuned >= scratch + 5, f"fine-tuned not clearly ahead at {few} per digit: {table}"
    assert all(row[2] > row[0] for row in table.values()), f"fine-tuned behind somewhere: {table}"
    for row in table.values():
        assert all(10.0 < mean <= 100.0 for mean in row)  # ten classes: chance is 10 %
    assert any("<svg" in o.get("data", {}).get("text/html", "") for c in cells for o in c.outputs)


_ROW = re.compile(r"^(\d+|all)\s+([0-9.]+) ± [0-9.]+\s+([0-9.]+) ± [0-9.]+\s+([0-9.]+) ± [0-9.]+$")


def _curve_table(cells: list[nbformat.NotebookNode]) -> dict[str, tuple[float, float, float]]:
    """The learning curve's means (from scratch, linear probe, fine-tuned) per label count,
    read from the printed table under its header."""
    text = next((_stdout(c) for c in cells if "labels/class" in _stdout(c)), "")
    lines = text.splitlines()
    header = next((line for line in lines if line.startswith("labels/class")), "")
    assert header.split()[1:] == ["from", "scratch", "linear", "probe", "fine-tuned"], text
    rows = {}
    for line in lines:
        if match := _ROW.match(line.strip()):
            rows[match[1]] = (float(match[2]), float(match[3]), float(match[4]))
    return rows


def test_runner_reports_the_failing_cell(
    isolated_env: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "PROGRESS_EVERY_S", 0.0)  # echo every in-place update
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    path = isolated_env / "broken.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("not executed"),
        nbformat.v4.new_code_cell(
            "import os\nprint(os.getcwd())\nprint('wait policy', os.environ['OMP_WAIT_POLICY'])"
        ),
        nbformat.v4.new_code_cell(
            "from IPython.display import display\n"
            "handle = display('progress %d of 3' % 1, display_id=True)\n"
            "for n in (2, 3):\n"
            "    handle.update('progress %d of 3' % n)"
        ),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("print('unreachable')"),
    ]
    nbformat.write(nb, path)

    out = isolated_env / "out" / "broken.ipynb"
    with pytest.raises(runner.NotebookCellError) as failure:
        runner.execute_notebook(path, out=out, echo=True)
    assert failure.value.cell_number == 3
    assert failure.value.ename == "ZeroDivisionError"
    echoed = capsys.readouterr().out
    assert "--- cell 1 " in echoed
    assert str(isolated_env.resolve()) in echoed  # the kernel runs in the notebook's folder
    assert "wait policy PASSIVE" in echoed  # idle OpenMP threads sleep: kinder to a busy machine
    # in-place updates (how %fit shows progress) reach the terminal, each once
    assert [echoed.count(f"'progress {n} of 3'") for n in (1, 2, 3)] == [1, 1, 1]
    assert "unreachable" not in echoed
    assert out.exists()  # written even on failure, for inspection

    assert runner.main([str(path), "--quiet"]) == 1
    assert "cell 3" in capsys.readouterr().err


def test_runner_sets_no_cell_time_limit_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine makes a healthy cell slow; only an explicit --timeout limits it."""
    assert inspect.signature(runner.execute_notebook).parameters["timeout"].default is None
    limits: list[int | None] = []
    monkeypatch.setattr(
        runner, "execute_notebook", lambda *args, timeout, **kw: limits.append(timeout)
    )
    assert runner.main(["any.ipynb", "--quiet"]) == 0
    assert runner.main(["any.ipynb", "--quiet", "--timeout", "5"]) == 0
    assert limits == [None, 5]
