"""Tab completion latency: what a front end waits for after TAB, through IPython's own
completer (``Completer.completions``, what ipykernel answers a ``complete_request`` with).

Not a test. Run from the repository root::

    .venv/bin/python bench/completion.py [--repeat N]

For each line (resnet50 bound as ``model`` with an AdamW, two loaders) it prints the first
call (the zoo's lists are read then, and cached) and the MEDIAN of the next ``--repeat``
calls in ms, with the number of candidates. Target: every warm completion < 50 ms. timm's
first ``timm:`` completion includes importing timm when it is not imported yet (seconds);
bare names leave timm alone until it is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from IPython.core.completer import provisionalcompleter
from IPython.core.interactiveshell import InteractiveShell
from machine import describe
from torch.utils.data import DataLoader, TensorDataset
from torchvision import models

TARGET_MS = 50.0
LINES = (
    "%freeze la",
    "%freeze model.layer4.",
    "%fit ",
    "%lr_find model t",
    "%fit train_loader --unfreeze layer4,la",
    "%load_model res",
    "%load_model resnet50 --weights ",
    "%load_model timm:conv",
    "%tm help f",
)


def _complete(shell: InteractiveShell, text: str) -> tuple[float, int]:
    start = time.perf_counter()
    with provisionalcompleter():
        found = list(shell.Completer.completions(text, len(text)))
    return (time.perf_counter() - start) * 1e3, len(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    print(describe())
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "torchmagic")
    model = models.resnet50(weights=None)
    data = TensorDataset(torch.randn(8, 3, 8, 8), torch.zeros(8, dtype=torch.long))
    shell.user_ns.update(
        model=model,
        opt=torch.optim.AdamW(model.parameters()),
        train_loader=DataLoader(data, batch_size=4),
        val_loader=DataLoader(data, batch_size=4),
    )
    print(f"{'line':<42} {'first ms':>9} {'median ms':>10} {'answers':>8}  verdict")
    failed = False
    for line in LINES:
        first, count = _complete(shell, line)
        warm = statistics.median(_complete(shell, line)[0] for _ in range(args.repeat))
        verdict = "PASS" if warm < TARGET_MS else "FAIL"
        failed |= verdict == "FAIL"
        print(f"{line:<42} {first:9.1f} {warm:10.2f} {count:8d}  {verdict}")
    print(f"timm imported: {'timm' in sys.modules}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
