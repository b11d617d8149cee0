"""A saved session resumed on every rank, then wrapped in DistributedDataParallel: two real
gloo ranks on 127.0.0.1. Each rank builds the model its own way (another seed), resumes,
wraps, trains two steps on its own data; gradient averaging keeps them bit-identical.

Both ranks run this file as a script (``python test_resume_distributed.py RANK CKPT OUT``).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import nn

import torchmagic
from gloo_ranks import run_ranks

pytestmark = pytest.mark.slow

WORLD = 2
TIMEOUT_S = 120


def build(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


def steps(model: nn.Module, opt, sched, gen: torch.Generator, n: int) -> None:
    for _ in range(n):
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def _worker(rank: int, checkpoint: Path, out: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        model, opt, sched = build(seed=100 + rank)  # each rank starts elsewhere
        tm = torchmagic.resume(checkpoint, model, opt, [sched])
        resumed = {k: v.clone() for k, v in model.state_dict().items()}
        ddp = nn.parallel.DistributedDataParallel(model)
        steps(ddp, opt, sched, torch.Generator().manual_seed(rank), 2)
        record = {
            "resumed": resumed,
            "trained": {k: v.clone() for k, v in model.state_dict().items()},
            "lrs": [g["lr"] for g in opt.param_groups],
            "flags": [p.requires_grad for p in model.parameters()],
            "history": [e.command for e in tm.history()],
        }
        torch.save(record, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list[dict], dict]:
    folder = tmp_path_factory.mktemp("resume-ddp")
    model, opt, sched = build(seed=0)
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    tm.freeze("0")
    tm.replace_head("5", 3)
    steps(model, opt, sched, torch.Generator().manual_seed(9), 2)
    tm.unfreeze("0", lr=1e-3)
    steps(model, opt, sched, torch.Generator().manual_seed(9), 1)
    tm.save(folder / "run.pt")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    run_ranks(__file__, WORLD, TIMEOUT_S, str(folder / "run.pt"), str(folder))
    records = [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    return records, saved


def test_every_rank_resumes_the_saved_weights(ranks):
    records, saved = ranks
    for record in records:
        assert record["resumed"].keys() == saved.keys()
        assert all(torch.equal(record["resumed"][k], saved[k]) for k in saved)
        assert record["history"] == [
            'tm.freeze("0")',
            'tm.replace_head("5", 3)',
            'tm.unfreeze("0", lr=0.001)',
        ]


def test_ranks_stay_identical_after_wrapping_and_training(ranks):
    (first, second), saved = ranks
    for key in saved:
        assert torch.equal(first["trained"][key], second["trained"][key]), key
    assert not torch.equal(first["trained"]["5.weight"], saved["5.weight"])  # it trained
    assert first["lrs"] == second["lrs"] and first["flags"] == second["flags"]


if __name__ == "__main__":
    _worker(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
