"""What ``%load_ext torchmagic`` costs over ``import torch``, in fresh processes.

Not a test. Run from the repository root::

    .venv/bin/python bench/load_time.py [--runs N]

Each run starts new Python processes, alternating: one times ``import torch``; one
builds a bare ``InteractiveShell`` (untimed), then times ``%load_ext torchmagic`` (which
imports torch itself), and reports which heavy libraries the load imported and whether
CUDA was initialised; one times ``import torch, torchvision`` for scale (what every load
cost before torchvision was imported lazily). Prints medians over the runs, the load's
cost over ``import torch``, and a PASS/FAIL line for the target: under 0.3 s over
``import torch``, no torchvision, no rich, CUDA untouched.

The load average is printed beside the numbers: on a shared machine ``cpu s`` (the
process's CPU time, immune to preemption) shows the work itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TARGET_S = 0.3
HEAVY = ("torchvision", "rich", "timm", "transformers", "peft", "matplotlib", "torch._dynamo")

_REPORT = f"""
import json, sys, time
wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
import torch
print(json.dumps({{"wall": wall, "cpu": cpu, "cuda": torch.cuda.is_initialized(),
                  "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""

CODE = {
    "import torch": "import time\nstart, cpu_start = time.perf_counter(), time.process_time()\n"
    "import torch\n",
    "%load_ext torchmagic": "import time\n"
    "from IPython.core.interactiveshell import InteractiveShell\n"
    "ip = InteractiveShell.instance()\n"
    "start, cpu_start = time.perf_counter(), time.process_time()\n"
    "ip.run_line_magic('load_ext', 'torchmagic')\n",
    "import torch, torchvision": "import time\n"
    "start, cpu_start = time.perf_counter(), time.process_time()\n"
    "import torch, torchvision\n",
}


def run_once(label: str) -> dict:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", CODE[label] + _REPORT],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load() -> str:
    if not hasattr(os, "getloadavg"):
        return "unknown"
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per row (>= 3)")
    parser.add_argument("--no-torchvision", action="store_true", help="skip the scale row")
    args = parser.parse_args(argv)
    if args.runs < 3:
        parser.error("--runs must be >= 3")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import describe

    print("# %load_ext torchmagic over import torch (bench/load_time.py)")
    print(describe())
    print(f"load average at start: {_load()}")
    labels = list(CODE)
    if args.no_torchvision:
        labels.remove("import torch, torchvision")
    results: dict[str, list[dict]] = {label: [] for label in labels}
    run_once("import torch")  # warm the file cache and the .pyc files
    run_once("%load_ext torchmagic")
    for _ in range(args.runs):
        for label in labels:
            results[label].append(run_once(label))
    torch_wall = statistics.median(r["wall"] for r in results["import torch"])
    torch_cpu = statistics.median(r["cpu"] for r in results["import torch"])
    print(f"\n{'what':28} {'median s':>9} {'min s':>7} {'cpu s':>7} {'over torch':>11}  imported")
    for label in labels:
        rows = results[label]
        wall = statistics.median(r["wall"] for r in rows)
        cpu = statistics.median(r["cpu"] for r in rows)
        low = min(r["wall"] for r in rows)
        over = "" if label == "import torch" else f"+{wall - torch_wall:.2f} s"
        loaded = sorted({m for r in rows for m in r["loaded"]})
        print(f"{label:28} {wall:9.2f} {low:7.2f} {cpu:7.2f} {over:>11}  {', '.join(loaded)}")
    ext = results["%load_ext torchmagic"]
    over_wall = statistics.median(r["wall"] for r in ext) - torch_wall
    over_cpu = statistics.median(r["cpu"] for r in ext) - torch_cpu
    heavy = sorted({m for r in ext for m in r["loaded"]})
    cuda = any(r["cuda"] for r in ext)
    ok = over_wall < TARGET_S and not heavy and not cuda
    print(f"\nload average at end: {_load()}; {args.runs} runs per row, alternating")
    print(
        f"{'PASS' if ok else 'FAIL'}  %load_ext torchmagic: +{over_wall:.2f} s wall "
        f"(+{over_cpu:.2f} s cpu) over import torch < {TARGET_S} s; heavy imports: "
        f"{', '.join(heavy) or 'none'}; CUDA initialised: {cuda}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
