"""Surgery under DistributedDataParallel and FSDP, on 2 real gloo ranks on 127.0.0.1.

Both ranks run this file as a script (``python test_distributed.py RANK OUTDIR``): every
phase of the scenario runs once per rank and each rank saves what it saw; the tests below
compare the two ranks' records. The pair is killed if it runs past the timeout. The
scenario itself takes about a second; nearly all the wall time is two fresh interpreters
importing torch and torchvision.
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
from torchmagic.core import distributed
from torchmagic.core.modules import unwrap

pytestmark = pytest.mark.slow

WORLD = 2
TIMEOUT_S = 90  # 46 s measured at load average 14 on 2 cores; a hang is killed here


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


# -- the worker: one rank ------------------------------------------------------------


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (gathered) copies of every parameter, for comparing ranks bit for bit."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = full.detach().clone()
    return out


def _train(model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, steps=3) -> None:
    """Steps on rank-specific data: only gradient averaging keeps the ranks equal."""
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8, generator=gen)).square().mean().backward()
        opt.step()


def _error(fn) -> str:
    try:
        fn()
    except torchmagic.TorchMagicError as exc:
        return str(exc)
    return ""


def _ddp_phases(rank: int, rec: dict) -> None:
    torch.manual_seed(rank)  # the ranks start different: DDP's broadcast makes them equal
    gen = torch.Generator().manual_seed(100 + rank)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    tm = torchmagic.Session(ddp, opt)
    _train(ddp, opt, gen)
    rec["start"] = _weights(model)

    change = tm.freeze("body.0")
    rec["freeze_notes"] = change.effect.notes
    rec["stale_forward"] = _error(lambda: ddp(torch.randn(2, 8)))
    with torch.no_grad():  # evaluating does not involve the reducer: allowed
        rec["stale_eval_shape"] = tuple(ddp(torch.randn(2, 8)).shape)
    frozen_before = model.body[0].weight.detach().clone()
    old, ddp = ddp, torchmagic.rewrap(ddp)
    rec["retired_forward"] = _error(lambda: old(torch.randn(2, 8)))
    rec["same_module"] = ddp.module is model
    _train(ddp, opt, gen)
    rec["freeze"] = _weights(model)
    rec["frozen_kept"] = torch.equal(frozen_before, model.body[0].weight)

    tm.unfreeze("body.0", lr=0.01)
    ddp = torchmagic.rewrap(ddp)
    _train(ddp, opt, gen)
    rec["unfreeze"] = _weights(model)
    rec["unfrozen_trained"] = not torch.equal(frozen_before, model.body[0].weight)

    tm.replace_head("fc", 3)  # each rank draws its own head; rewrap broadcasts rank 0's
    ddp = torchmagic.rewrap(ddp)
    _train(ddp, opt, gen)
    rec["replace_head"] = _weights(model)
    rec["head_in_optimizer"] = any(
        p is model.fc.weight for g in opt.param_groups for p in g["params"]
    )

    # only rank 0 changes: every rank refuses alike, no rank hangs in the collective
    if rank == 0:
        model.body[2].weight.requires_grad_(False)
    rec["ranks_differ"] = _error(lambda: torchmagic.rewrap(ddp))
    model.body[2].weight.requires_grad_(True)


def _settings_phase(rec: dict) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = Net()
    ddp = nn.parallel.DistributedDataParallel(
        model,
        find_unused_parameters=True,
        gradient_as_bucket_view=True,
        bucket_cap_mb=2,
        static_graph=False,
    )
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    new = torchmagic.rewrap(ddp)
    rec["settings_old"] = distributed._settings(ddp)
    rec["settings_new"] = distributed._settings(new)
    rec["hooks_new"] = [hook.__name__ for hook, _ in new._comm_hooks]
    for settings in ("settings_old", "settings_new"):
        rec[settings].pop("process_group")
    rec["same_group"] = new.process_group is ddp.process_group


def _fsdp1_phase(rec: dict) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for orig in (False, True):
        model = Net()
        fsdp = FSDP(model, use_orig_params=orig, device_id=torch.device("cpu"))
        opt = torch.optim.SGD(fsdp.parameters(), lr=0.1)
        flags = [p.requires_grad for p in fsdp.parameters()]
        groups = [list(g["params"]) for g in opt.param_groups]
        tm = torchmagic.Session(namespace={"model": model, "fsdp": fsdp, "opt": opt})
        rec[f"fsdp1_refusal_{orig}"] = _error(lambda tm=tm: tm.freeze("body.0"))
        rec[f"fsdp1_unchanged_{orig}"] = (
            flags == [p.requires_grad for p in fsdp.parameters()]
            and [list(g["params"]) for g in opt.param_groups] == groups
        )
        rec[f"fsdp1_unwrap_{orig}"] = unwrap(fsdp) is model
        alone = torchmagic.Session(fsdp, opt)
        rec[f"fsdp1_summary_{orig}"] = [row.name for row in alone.summary(depth=1).rows]
        rec[f"fsdp1_scope_{orig}"] = distributed.count_scope(model, [("fsdp", fsdp)])
        rec[f"fsdp1_head_refusal_{orig}"] = _error(lambda a=alone: a.replace_head("fc", 3))


def _fsdp2_phase(rank: int, rec: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(200 + rank)
    model = Net()
    for layer in (*model.body, model.fc):
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tm = torchmagic.Session(model, opt)
    _train(model, opt, gen, steps=1)
    tm.freeze("body.0")
    frozen_before = _weights(model)["body.0.weight"]
    _train(model, opt, gen)
    rec["fsdp2_freeze"] = _weights(model)
    rec["fsdp2_frozen_kept"] = torch.equal(frozen_before, rec["fsdp2_freeze"]["body.0.weight"])
    rec["fsdp2_head_refusal"] = _error(lambda: tm.replace_head("fc", 3))
    rec["fsdp2_scope"] = distributed.count_scope(model, [])


def _worker(rank: int, outdir: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=40))
    rec: dict = {}
    try:
        _ddp_phases(rank, rec)
        _settings_phase(rec)
        _fsdp1_phase(rec)
        _fsdp2_phase(rank, rec)
    finally:
        torch.save(rec, outdir / f"rank{rank}.pt")
        dist.destroy_process_group()


# -- the tests -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Run the scenario on 2 gloo ranks once; each rank's record."""
    outdir = tmp_path_factory.mktemp("ranks")
    run_ranks(__file__, WORLD, TIMEOUT_S, str(outdir))
    return [torch.load(outdir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _assert_ranks_equal(ranks: list[dict], key: str) -> None:
    first, second = ranks[0][key], ranks[1][key]
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), f"{key}: {name} differs across ranks"


@pytest.mark.parametrize("phase", ["start", "freeze", "unfreeze", "replace_head"])
def test_ranks_stay_bit_identical_after_surgery_and_rewrap(ranks, phase):
    _assert_ranks_equal(ranks, phase)
    for rec in ranks:
        assert rec["same_module"]
        assert rec["frozen_kept"] and rec["unfrozen_trained"]
        assert rec["head_in_optimizer"]
    assert ranks[0]["replace_head"]["fc.weight"].shape == (3, 16)


def test_surgery_on_ddp_names_rewrap_and_stale_wrapper_refuses(ranks):
    for rec in ranks:
        (note,) = rec["freeze_notes"]
        assert "every rank" in note and "model = torchmagic.rewrap(model)" in note
        assert "trainable parameters changed" in rec["stale_forward"]
        assert rec["stale_eval_shape"] == (2, 4)
        assert "replaced by torchmagic.rewrap" in rec["retired_forward"]


def test_rewrap_refuses_when_ranks_made_different_changes(ranks):
    for rec in ranks:
        assert "ranks' models differ" in rec["ranks_differ"]
        assert "rank 0: 5 trainable tensors" in rec["ranks_differ"]
        assert "rank 1: 6 trainable tensors" in rec["ranks_differ"]


def test_rewrap_keeps_settings_and_comm_hooks(ranks):
    rec = ranks[0]
    assert rec["settings_new"] == rec["settings_old"]
    assert rec["settings_old"]["find_unused_parameters"] is True
    assert rec["settings_old"]["gradient_as_bucket_view"] is True
    assert rec["settings_old"]["bucket_cap_mb"] == 2
    assert rec["hooks_new"] == ["allreduce_hook"]
    assert rec["same_group"]


@pytest.mark.parametrize("orig", [False, True])
def test_fsdp1_is_read_through_and_refused_for_surgery(ranks, orig):
    for rec in ranks:
        assert "before wrapping" in rec[f"fsdp1_refusal_{orig}"]
        assert "flat, sharded" in rec[f"fsdp1_refusal_{orig}"]
        assert "before wrapping" in rec[f"fsdp1_head_refusal_{orig}"]
        assert rec[f"fsdp1_unchanged_{orig}"]
        assert rec[f"fsdp1_unwrap_{orig}"]
        assert rec[f"fsdp1_scope_{orig}"] == "per-rank"
    rows = ranks[0][f"fsdp1_summary_{orig}"]
    assert ("body" in rows and "fc" in rows) and not any("_fsdp" in row for row in rows)


def test_fsdp2_freeze_keeps_ranks_equal_and_head_replacement_is_refused(ranks):
    _assert_ranks_equal(ranks, "fsdp2_freeze")
    for rec in ranks:
        assert rec["fsdp2_frozen_kept"]
        assert "before calling fully_shard" in rec["fsdp2_head_refusal"]
        assert rec["fsdp2_scope"] == "gathered"


def test_rewrap_refuses_what_is_not_ddp():
    with pytest.raises(torchmagic.TorchMagicError, match="takes a DistributedDataParallel"):
        torchmagic.rewrap(Net())


if __name__ == "__main__":
    _worker(int(sys.argv[1]), Path(sys.argv[2]))
