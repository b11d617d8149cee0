"""A saved session resumed on every rank, then wrapped in DistributedDataParallel: two real
gloo ranks on 127.0.0.1. Each rank builds the model its own way (another seed), resumes,
wraps, trains two steps on its own data; gradient averaging keeps them bit-identical.

Then surgery through the resumed Session after wrapping (docs/saving.md's order: resume, then
wrap), which the session was not given the wrapper for: the wrapper is found, its forward
refuses until ``torchmagic.rewrap``, and the run equals the same edit by hand (the old
wrapper, by hand, lets the ranks drift apart). Also a session given the wrapper, whose
second change must find the wrapper rewrap returned.

Both ranks run this file as a script (``python test_resume_distributed.py RANK FOLDER``).
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
TIMEOUT_S = 240  # 102 s measured at load 10 on 2 cores; a hang is killed here


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


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def error(fn) -> str:
    try:
        fn()
    except torchmagic.TorchMagicError as exc:
        return str(exc)
    return ""


def plain_steps(model: nn.Module, opt, gen: torch.Generator, n: int) -> None:
    for _ in range(n):
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _resume_then_wrap(rank: int, folder: Path) -> dict:
    model, opt, sched = build(seed=100 + rank)  # each rank starts elsewhere
    tm = torchmagic.resume(folder / "run.pt", model, opt, [sched])
    resumed = weights(model)
    ddp = nn.parallel.DistributedDataParallel(model)
    steps(ddp, opt, sched, torch.Generator().manual_seed(rank), 2)
    return {
        "resumed": resumed,
        "trained": weights(model),
        "lrs": [g["lr"] for g in opt.param_groups],
        "flags": [p.requires_grad for p in model.parameters()],
        "history": [e.command for e in tm.history()],
    }


def _surgery_after_wrapping(rank: int, folder: Path) -> dict:
    """The order docs/saving.md gives, then tm.unfreeze through the resumed Session (given the raw
    module): the wrapper it was not given refuses to train until rewrap."""
    model = build(seed=100 + rank)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tm = torchmagic.resume(folder / "frozen.pt", model, opt)
    ddp = nn.parallel.DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(rank)
    plain_steps(ddp, opt, gen, 1)
    change = tm.unfreeze("0", lr=1e-3)
    before = weights(model), {k: v.clone() for k, v in opt.state[model[2].weight].items()}
    refusal = error(lambda: ddp(torch.randn(4, 8, generator=gen)))
    unchanged = all(torch.equal(v, weights(model)[k]) for k, v in before[0].items()) and all(
        torch.equal(v, opt.state[model[2].weight][k]) for k, v in before[1].items()
    )
    ddp = torchmagic.rewrap(ddp)
    plain_steps(ddp, opt, gen, 2)
    return {
        "notes": change.effect.notes,
        "refusal": refusal,
        "unchanged": unchanged and all(p.grad is None for p in model.parameters()),
        "rewrapped": weights(model),
        "groups": [len(g["params"]) for g in opt.param_groups],
    }


def _same_edit_by_hand(rank: int, folder: Path, rewrap: bool) -> dict[str, torch.Tensor]:
    """The same unfreeze without torchmagic's edit: flags on, a param group at 1e-3, and
    a new DistributedDataParallel (``rewrap``) or the old one training on."""
    model = build(seed=100 + rank)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torchmagic.resume(folder / "frozen.pt", model, opt)
    ddp = nn.parallel.DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(rank)
    plain_steps(ddp, opt, gen, 1)
    for p in model[0].parameters():
        p.requires_grad_(True)
    opt.add_param_group({"params": list(model[0].parameters()), "lr": 1e-3})
    torch.randn(4, 8, generator=gen)  # as the refused forward of the torchmagic run
    if rewrap:
        ddp = nn.parallel.DistributedDataParallel(model)
    plain_steps(ddp, opt, gen, 2)
    return weights(model)


def _session_given_the_wrapper(rank: int) -> dict:
    """A session over the wrapper: after rewrap its namespace still holds the old one, so
    the next change must find the new wrapper to guard it."""
    torch.manual_seed(rank)
    model = build(seed=100 + rank)[0]
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tm = torchmagic.Session(ddp, opt)
    tm.freeze("0")
    ddp = torchmagic.rewrap(ddp)
    second = tm.unfreeze("0")
    refusal = error(lambda: ddp(torch.randn(4, 8)))
    ddp = torchmagic.rewrap(ddp)
    plain_steps(ddp, opt, torch.Generator().manual_seed(rank), 2)
    return {"notes": second.effect.notes, "refusal": refusal, "trained": weights(model)}


def _worker(rank: int, folder: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        record = _resume_then_wrap(rank, folder)
        record["after_wrapping"] = _surgery_after_wrapping(rank, folder)
        record["by_hand"] = _same_edit_by_hand(rank, folder, rewrap=True)
        record["by_hand_stale"] = _same_edit_by_hand(rank, folder, rewrap=False)
        record["given_wrapper"] = _session_given_the_wrapper(rank)
        torch.save(record, folder / f"rank{rank}.pt")
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
    model = build(seed=0)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    frozen = torchmagic.Session(model, opt)
    frozen.freeze("0")
    plain_steps(model, opt, torch.Generator().manual_seed(9), 2)
    frozen.save(folder / "frozen.pt")
    run_ranks(__file__, WORLD, TIMEOUT_S, str(folder))
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


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_surgery_after_wrapping_refuses_the_old_wrapper_until_rewrap(ranks):
    records, _ = ranks
    for record in records:
        run = record["after_wrapping"]
        (note,) = run["notes"]
        assert note.startswith("a DistributedDataParallel the session was not given wraps it")
        assert "ddp_model = torchmagic.rewrap(ddp_model)" in note
        assert "\n" not in run["refusal"] and "trainable parameters changed" in run["refusal"]
        assert "ddp_model = torchmagic.rewrap(ddp_model)" in run["refusal"]
        assert run["unchanged"]
        assert run["groups"] == [4, 2]


def test_after_rewrap_the_ranks_equal_the_same_edit_by_hand(ranks):
    records, _ = ranks
    for record in records:
        assert _equal(record["after_wrapping"]["rewrapped"], record["by_hand"])
    assert _equal(records[0]["by_hand"], records[1]["by_hand"])
    # the old wrapper, by hand: the unfrozen block is not averaged and the ranks drift
    first, second = (r["by_hand_stale"] for r in records)
    assert not torch.equal(first["0.weight"], second["0.weight"])
    assert torch.equal(first["2.weight"], second["2.weight"])


def test_a_session_given_the_wrapper_guards_the_one_rewrap_returned(ranks):
    records, _ = ranks
    for record in records:
        run = record["given_wrapper"]
        (note,) = run["notes"]
        assert "trainable parameters changed" in run["refusal"]
        assert "ddp_model = torchmagic.rewrap(ddp_model)" in note
    assert _equal(records[0]["given_wrapper"]["trained"], records[1]["given_wrapper"]["trained"])


if __name__ == "__main__":
    _worker(int(sys.argv[1]), Path(sys.argv[2]))
