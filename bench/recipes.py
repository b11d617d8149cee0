"""Fine-tuning recipes on the quickstart's few-label task: head only, everything unfrozen
at once (``Session.fine_tune``) and progressive unfreezing (``Session.fit(unfreeze=...)``).

Not a test. Run from the repository root::

    .venv/bin/python bench/recipes.py [--epochs 6] [--k 10] [--seeds 0 1 2] [--cache build/weights]

Task (``examples/digits.py``, the quickstart's): a small ResNet pretrained on upright
digits (cached under ``--cache``; trained once, about half a minute, when absent), a new
10-class head, K labelled examples of each digit turned upside down for training, accuracy
measured on ``--test-size`` held-out upside-down images (a fixed random subset). Each
seed changes the K-shot sample, the head's initialisation and the batch order. Every
recipe trains ``--epochs`` epochs in total with AdamW (weight decay 1e-4, head lr 3e-3),
batch 25, BatchNorm of frozen blocks held in eval (the default policy):

- head only: the backbone frozen throughout, the head trained on cached features
  (``cache_features=True``: the backbone runs once);
- all at once: ``fine_tune(freeze_epochs=2, epochs=E-2, lr=3e-3)``: the head alone for 2
  epochs, then every block at lrs spread from 3e-5 (stem) to 3e-3 (head);
- progressive: the head alone for ``--every`` epochs, then ``layer4, layer3, layer2,
  layer1`` unfrozen one every ``--every`` epochs (default 1), lr ratio 0.3 per block.

``fine_tune`` validates on the training set here (it requires a val loader; its score is
not used): the accuracies are measured on the test images after the run.

Prints final accuracy (mean ± std over seeds, and each seed) and wall time per recipe.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from digits import accuracy, load_digits_splits, make_loader, pretrained_small_resnet  # noqa: E402

from torchmagic import Session  # noqa: E402

HEAD_LR = 3e-3
BATCH = 25


def _session(cache: Path, seed: int, k: int, test_size: int):
    data = load_digits_splits(labels_per_class=k, seed=seed)
    pick = torch.randperm(len(data.test), generator=torch.Generator().manual_seed(0))
    test_set = torch.utils.data.Subset(data.test, pick[:test_size].tolist())
    model = pretrained_small_resnet(cache, verbose=False)
    torch.manual_seed(seed)
    model.fc = torch.nn.Linear(model.fc.in_features, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=HEAD_LR, weight_decay=1e-4)
    tm = Session(model, optimizer)
    train = make_loader(data.train, batch_size=BATCH, seed=seed)
    test = make_loader(test_set, batch_size=256, shuffle=False)
    return tm, model, train, test


def head_only(tm: Session, train, epochs: int, every: int) -> None:
    tm.freeze("model", exclude=["fc"])
    tm.fit(train, epochs=epochs, cache_features=True)


def all_at_once(tm: Session, train, epochs: int, every: int) -> None:
    tm.fine_tune(train, val=train, epochs=epochs - 2, freeze_epochs=2, lr=HEAD_LR)


def progressive(tm: Session, train, epochs: int, every: int) -> None:
    tm.freeze("model", exclude=["fc"])
    blocks = ["layer4", "layer3", "layer2", "layer1"]
    tm.fit(train, epochs=epochs, unfreeze=blocks, every=every, lr_ratio=0.3)


RECIPES = {"head only": head_only, "all at once": all_at_once, "progressive": progressive}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--test-size", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", type=Path, default=Path("build/weights"))
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"few-label digits: K={args.k} per class, {args.epochs} epochs, seeds {args.seeds}, "
        f"{args.threads} threads, load average {os.getloadavg()[0]:.1f}"
    )
    rows = []
    for name, recipe in RECIPES.items():
        accuracies, seconds = [], []
        for seed in args.seeds:
            tm, model, train, test = _session(args.cache, seed, args.k, args.test_size)
            start = time.perf_counter()
            recipe(tm, train, args.epochs, args.every)
            seconds.append(time.perf_counter() - start)
            accuracies.append(accuracy(model, test))
            print(
                f"{name}, seed {seed}: {100 * accuracies[-1]:.1f} %, {seconds[-1]:.1f} s",
                flush=True,
            )
        rows.append((name, accuracies, seconds))
    print("\n| recipe | accuracy (mean ± std) | per seed | wall time (median s) |")
    print("|---|---|---|---|")
    for name, accuracies, seconds in rows:
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
        each = " / ".join(f"{100 * a:.1f}" for a in accuracies)
        print(
            f"| {name} | {100 * statistics.mean(accuracies):.1f} % ± {100 * spread:.1f} "
            f"| {each} | {statistics.median(seconds):.1f} |"
        )


if __name__ == "__main__":
    main()
