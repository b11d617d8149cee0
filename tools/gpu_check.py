"""The GPU check: the ``gpu`` tests and the GPU sections of the benchmarks, one table.

Run on a machine with a CUDA device (``make gpu-check``); about five minutes on one GPU.
Without one it says so and exits 0. Each part runs in its own process (a fresh CUDA
context, and a crash in one does not hide the others); their output is shown as it
comes, then one summary table. Exit status 1 when a part fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FIT_GPU_SECTION = (
    "import sys; sys.path[:0] = ['bench']; import fit; "
    "section, checks = fit.gpu(quick=True); section.print(); "
    "[print(('PASS ' if c.ok else 'FAIL ') + c.text) for c in checks if c.ok is not None]; "
    "sys.exit(0 if all(c.ok for c in checks if c.ok is not None) else 1)"
)
PARTS = (
    ("gpu tests (pytest -m gpu)", [sys.executable, "-m", "pytest", "-m", "gpu", "-q"]),
    ("bench/memory.py GPU section", [sys.executable, "bench/memory.py", "--gpu-only"]),
    ("bench/fit.py GPU section (quick)", [sys.executable, "-c", FIT_GPU_SECTION]),
)
BUDGET_S = 300


@dataclass(frozen=True)
class Outcome:
    name: str
    ok: bool
    seconds: float
    summary: str  # the part's last line


def run(name: str, command: list[str], timeout: float) -> Outcome:
    print(f"\n==== {name}: {' '.join(command[:4])}", flush=True)
    start = time.perf_counter()
    lines: list[str] = []
    try:
        with subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                print(line, end="", flush=True)
                lines.append(line.rstrip())
            code = process.wait(timeout=max(timeout - (time.perf_counter() - start), 1))
    except subprocess.TimeoutExpired:
        process.kill()
        return Outcome(name, False, time.perf_counter() - start, f"timed out after {timeout} s")
    summary = next((x for x in reversed(lines) if x.strip()), "")
    return Outcome(name, code == 0, time.perf_counter() - start, summary)


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; nothing was run (this is not a failure)")
        return 0
    name = torch.cuda.get_device_name(0)
    print(f"gpu-check on {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    start = time.perf_counter()
    outcomes = []
    for part, command in PARTS:
        left = BUDGET_S * 2 - (time.perf_counter() - start)  # hard stop at twice the aim
        outcomes.append(run(part, command, left))
    width = max(len(o.name) for o in outcomes)
    print(f"\n## gpu-check summary ({name})")
    print(f"{'part'.ljust(width)}  result  seconds  last line")
    for o in outcomes:
        verdict = "PASS" if o.ok else "FAIL"
        print(f"{o.name.ljust(width)}  {verdict:6}  {o.seconds:7.0f}  {o.summary[:100]}")
    total = time.perf_counter() - start
    aim = "within" if total <= BUDGET_S else "OVER"
    print(f"total {total:.0f} s ({aim} the {BUDGET_S} s aim)")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
