"""A notebook's save resumed into an FSDP2-sharded model on 2 real gloo ranks (127.0.0.1),
against the same run written by hand in plain PyTorch + torch.distributed.checkpoint.

The file: a body block frozen, the head replaced, two AdamW steps under a cosine schedule,
then the block unfrozen at its own lr (so it has no optimizer state yet). On each rank:

- torchmagic: ``resume(..., shard=shard)`` on the model as first built, three steps;
- by hand: the same structure by hand, the weights loaded, ``fully_shard``, AdamW built
  after it with the file's groups, ``set_optimizer_state_dict(full_state_dict=True)``,
  the scheduler's state, three steps;
- the wrong orders: ``fully_shard`` then ``resume`` (refused), ``resume`` then
  ``fully_shard`` by hand then a step (refused), and what they leave;
- surgery on the sharded model: freeze after a step (state set aside, undo bit for bit,
  against the same freeze by hand), the refusals of new layers.

Both ranks run this file as a script (``python test_fsdp_resume.py RANK CKPT OUT``).
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
TIMEOUT_S = 240  # 99 s measured at load 10 on 2 cores; a hang is killed here
STEPS = 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def build(seed: int) -> tuple[Net, torch.optim.AdamW, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


def train(model: nn.Module, opt, sched, gen: torch.Generator, steps: int = STEPS) -> None:
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: full(p) for n, p in model.named_parameters()}


def opt_state(model: nn.Module, opt) -> dict[str, dict]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: {k: full(v) if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for p, s in opt.state.items()
    }


def groups(model: nn.Module, opt) -> list[tuple[list[str], float]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [([names[id(p)] for p in g["params"]], g["lr"]) for g in opt.param_groups]


def error(fn) -> str:
    try:
        fn()
    except torchmagic.TorchMagicError as exc:
        return str(exc)
    return ""


# -- one rank ----------------------------------------------------------------------


def _shard_plan(mesh):
    from torch.distributed.fsdp import fully_shard

    def shard(model: nn.Module) -> None:
        for layer in (*model.body, model.fc):
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    return shard


def _torchmagic_run(rank: int, ckpt: Path, shard, rec: dict) -> None:
    model, opt, sched = build(seed=100 + rank)  # each rank starts elsewhere
    kept_opt, first_group = opt, opt.param_groups[0]
    tm = torchmagic.resume(ckpt, model, opt, [sched], shard=shard)
    rec["tm_resumed"] = weights(model)
    rec["tm_resumed_state"] = opt_state(model, opt)
    rec["tm_groups"] = groups(model, opt)
    rec["tm_same_groups"] = kept_opt is opt and opt.param_groups[0] is first_group
    rec["tm_all_dtensors"] = all(
        type(p).__name__ == "DTensor" for g in opt.param_groups for p in g["params"]
    )
    rec["tm_history"] = [(e.command, e.stale) for e in tm.history()]
    train(model, opt, sched, torch.Generator().manual_seed(rank))
    rec["tm_trained"] = weights(model)
    rec["tm_trained_state"] = opt_state(model, opt)
    rec["tm_lrs"] = [g["lr"] for g in opt.param_groups]
    _surgery_on_sharded(rank, tm, model, opt, sched, rec)


def _by_hand_run(rank: int, ckpt: Path, shard, rec: dict) -> None:
    """The same continuation without torchmagic: structure by hand, fully_shard, the
    optimizer after it, its state through torch.distributed.checkpoint."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    saved = torch.load(ckpt, weights_only=True)
    torch.manual_seed(100 + rank)
    model = Net()
    model.fc = nn.Linear(16, 3)
    model.load_state_dict(saved["model"]["state_dict"])
    for name, p in model.named_parameters():
        p.requires_grad_(saved["model"]["requires_grad"][name])
    shard(model)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(
        [
            {**g["hyperparameters"], "params": [params[n] for n in g["params"]]}
            for g in saved["optimizer"]["groups"]
        ]
    )
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    osd = {
        "state": saved["optimizer"]["state"],
        "param_groups": [
            {**g["hyperparameters"], "params": g["params"]} for g in saved["optimizer"]["groups"]
        ],
    }
    set_optimizer_state_dict(
        model, opt, osd, options=StateDictOptions(full_state_dict=True, strict=False)
    )
    # DCP makes state with a step at lr 0: a parameter the file has no state for gets one
    rec["dcp_step_of_stateless"] = float(opt.state[params["body.0.weight"]]["step"])
    for name, p in params.items():
        if name not in saved["optimizer"]["state"]:
            opt.state.pop(p, None)
    sched.load_state_dict(saved["schedulers"][0]["state"])
    torch.set_rng_state(saved["rng"]["torch"])
    rec["hand_resumed"] = weights(model)
    rec["hand_resumed_state"] = opt_state(model, opt)
    rec["hand_groups"] = groups(model, opt)
    train(model, opt, sched, torch.Generator().manual_seed(rank))
    rec["hand_trained"] = weights(model)
    rec["hand_trained_state"] = opt_state(model, opt)
    rec["hand_lrs"] = [g["lr"] for g in opt.param_groups]
    # the same freeze as the torchmagic run's, by hand
    gen = torch.Generator().manual_seed(50 + rank)
    train(model, opt, sched, gen, steps=1)
    frozen = [params["body.2.weight"], params["body.2.bias"]]
    for p in frozen:
        p.requires_grad_(False)
        opt.state.pop(p)
    for g in opt.param_groups:
        g["params"] = [p for p in g["params"] if all(p is not q for q in frozen)]
    train(model, opt, sched, gen, steps=2)
    rec["hand_after_freeze"] = weights(model)


def _surgery_on_sharded(rank: int, tm, model: nn.Module, opt, sched, rec: dict) -> None:
    gen = torch.Generator().manual_seed(50 + rank)
    train(model, opt, sched, gen, steps=1)  # state exists for every trainable tensor
    members = [list(g["params"]) for g in opt.param_groups]
    state = opt_state(model, opt)
    rec["freeze_expected_bytes"] = sum(  # what this rank holds of the state set aside
        (v.to_local() if hasattr(v, "to_local") else v).untyped_storage().nbytes()
        for p in model.body[2].parameters()
        for v in opt.state[p].values()
    )
    change = tm.freeze("body.2")
    rec["freeze_flags"] = [p.requires_grad for p in model.body[2].parameters()]
    rec["freeze_out_of_opt"] = not any(
        p is q for g in opt.param_groups for p in g["params"] for q in model.body[2].parameters()
    )
    rec["freeze_state_gone"] = all(p not in opt.state for p in model.body[2].parameters())
    rec["freeze_bytes"] = tm.history_bytes()
    rec["freeze_notes"] = change.effect.notes
    tm.undo()
    rec["undo_groups"] = all(
        len(a) == len(b) and all(p is q for p, q in zip(a, b, strict=True))
        for a, b in zip(members, [g["params"] for g in opt.param_groups], strict=True)
    )
    after = opt_state(model, opt)
    rec["undo_state"] = after.keys() == state.keys() and all(
        torch.equal(after[n][k], state[n][k]) if isinstance(state[n][k], torch.Tensor) else True
        for n in state
        for k in state[n]
    )
    rec["undo_dtensor"] = type(opt.state[model.body[2].weight]["exp_avg"]).__name__
    rec["undo_flags"] = [p.requires_grad for p in model.body[2].parameters()]
    tm.freeze("body.2")
    train(model, opt, sched, gen, steps=2)
    rec["tm_after_freeze"] = weights(model)
    rec["head_refusal"] = error(lambda: tm.replace_head("fc", 5))
    rec["lora_refusal"] = error(lambda: tm.lora("body.0", r=2))
    tm.undo()  # the second freeze
    rec["undo_resumed"] = error(tm.undo)


def _shard_a_session(rank: int, shard, rec: dict) -> None:
    """tm.shard on a session's own model: its commands before can no longer be undone,
    the home groups follow the sharded parameters."""
    model, opt, sched = build(seed=0)
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    tm.freeze("body.0")
    train(model, opt, sched, torch.Generator().manual_seed(rank), steps=1)
    kept = [id(g) for g in opt.param_groups], [id(g["params"]) for g in opt.param_groups]
    report = tm.shard(shard)
    rec["shard_kept_groups"] = kept == (
        [id(g) for g in opt.param_groups],
        [id(g["params"]) for g in opt.param_groups],
    )
    rec["report"] = (report.parameters, report.sharded, report.groups, report.states)
    rec["report_bytes"] = report.state_bytes
    rec["undo_after_shard"] = error(tm.undo)
    tm.unfreeze("body.0")  # home: the group it left
    rec["unfrozen_home"] = [
        i
        for i, g in enumerate(opt.param_groups)
        if any(p is model.body[0].weight for p in g["params"])
    ]
    train(model, opt, sched, torch.Generator().manual_seed(rank), steps=1)
    rec["session_sharded"] = weights(model)


def _wrong_orders(rank: int, ckpt: Path, shard, rec: dict) -> None:
    # fully_shard, then resume: refused, nothing changed
    model, _, _ = build(seed=100 + rank)
    shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    before = weights(model)
    rec["shard_then_resume"] = error(lambda: torchmagic.resume(ckpt, model, opt, [sched]))
    rec["shard_then_resume_unchanged"] = (
        all(torch.equal(before[n], w) for n, w in weights(model).items())
        and not opt.state
        and all(p.requires_grad for p in model.parameters())
        and len(opt.param_groups) == 1
    )
    # resume, then fully_shard by hand: the optimizer holds the old tensors; its step refuses
    model, opt, sched = build(seed=100 + rank)
    torchmagic.resume(ckpt, model, opt, [sched])
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    shard(model)
    before = weights(model)
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    nn.functional.cross_entropy(model(x), y).backward()
    rec["stale_step"] = error(opt.step)
    rec["stale_step_unchanged"] = all(
        torch.equal(before[n], w) for n, w in weights(model).items()
    ) and all(torch.equal(opt.state[p][k], v) for p in opt.state for k, v in state[id(p)].items())
    # shard twice: refused
    tm = torchmagic.Session(model, None)
    rec["shard_twice"] = error(lambda: tm.shard(shard))


def _worker(rank: int, ckpt: Path, out: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    rec: dict = {}
    try:
        shard = _shard_plan(init_device_mesh("cpu", (WORLD,)))
        _torchmagic_run(rank, ckpt, shard, rec)
        _by_hand_run(rank, ckpt, shard, rec)
        _wrong_orders(rank, ckpt, shard, rec)
        _shard_a_session(rank, shard, rec)
    finally:
        torch.save(rec, out / f"rank{rank}.pt")
        dist.destroy_process_group()


# -- the tests ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list[dict], dict]:
    folder = tmp_path_factory.mktemp("resume-fsdp")
    model, opt, sched = build(seed=0)
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    tm.freeze("body.0")
    tm.replace_head("fc", 3)
    train(model, opt, sched, torch.Generator().manual_seed(9), steps=2)
    tm.unfreeze("body.0", lr=1e-3)  # trainable, no optimizer state yet
    tm.save(folder / "run.pt")
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    run_ranks(__file__, WORLD, TIMEOUT_S, str(folder / "run.pt"), str(folder))
    records = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return records, saved


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _equal_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[n].keys() == b[n].keys()
        and all(
            torch.equal(a[n][k], b[n][k])
            if isinstance(a[n][k], torch.Tensor)
            else a[n][k] == b[n][k]
            for k in a[n]
        )
        for n in a
    )


def test_sharded_resume_is_the_saved_state_on_every_rank(ranks):
    records, saved = ranks
    for rec in records:
        assert _equal(rec["tm_resumed"], saved)
        assert rec["tm_all_dtensors"] and rec["tm_same_groups"]
        assert rec["tm_groups"] == rec["hand_groups"]
        assert _equal_state(rec["tm_resumed_state"], rec["hand_resumed_state"])
        assert "body.0.weight" not in rec["tm_resumed_state"]  # unfrozen after the last step
        assert rec["tm_history"][-1] == (
            'tm.unfreeze("body.0", lr=0.001)',
            "replayed from a checkpoint",
        )


def test_sharded_training_equals_the_same_run_by_hand(ranks):
    records, saved = ranks
    for rec in records:
        assert _equal(rec["tm_trained"], rec["hand_trained"])
        assert _equal_state(rec["tm_trained_state"], rec["hand_trained_state"])
        assert rec["tm_lrs"] == rec["hand_lrs"]
        assert not torch.equal(rec["tm_trained"]["body.0.weight"], saved["body.0.weight"])
    assert _equal(records[0]["tm_trained"], records[1]["tm_trained"])


def test_dcp_alone_gives_a_stateless_parameter_a_first_step(ranks):
    """Why the session drops that state again: Adam would correct its next step as a
    second one."""
    records, _ = ranks
    assert all(rec["dcp_step_of_stateless"] == 1.0 for rec in records)


def test_freeze_on_the_sharded_model_sets_state_aside_and_undoes_bit_for_bit(ranks):
    records, _ = ranks
    for rec in records:
        assert rec["freeze_flags"] == [False, False]
        assert rec["freeze_out_of_opt"] and rec["freeze_state_gone"]
        assert rec["freeze_bytes"] == rec["freeze_expected_bytes"] > 0  # this rank's shards
        assert rec["undo_groups"] and rec["undo_state"]
        assert rec["undo_dtensor"] == "DTensor" and rec["undo_flags"] == [True, True]
        assert _equal(rec["tm_after_freeze"], rec["hand_after_freeze"])
    assert _equal(records[0]["tm_after_freeze"], records[1]["tm_after_freeze"])


def test_new_layers_on_the_sharded_model_are_refused(ranks):
    records, _ = ranks
    for rec in records:
        assert rec["head_refusal"].startswith("cannot replace the head of a fully_shard model")
        assert rec["lora_refusal"].startswith("cannot add LoRA adapters to a fully_shard model")
        assert "before calling fully_shard" in rec["lora_refusal"]


def test_commands_before_sharding_are_not_undone(ranks):
    records, _ = ranks
    for rec in records:
        assert "replayed from a checkpoint" in rec["undo_resumed"]
        assert rec["undo_after_shard"].startswith(
            'cannot undo tm.freeze("body.0"): fully_shard has sharded the model since'
        )


def test_shard_keeps_a_sessions_groups_and_homes(ranks):
    records, _ = ranks
    for rec in records:
        assert rec["report"] == (6, 6, 1, 4)  # body.0 frozen: its 2 tensors hold no state
        assert rec["report_bytes"] > 0 and rec["shard_kept_groups"]
        assert rec["unfrozen_home"] == [0]
    assert _equal(records[0]["session_sharded"], records[1]["session_sharded"])


def test_the_wrong_orders_are_refused_in_one_line_naming_the_right_one(ranks):
    records, _ = ranks
    for rec in records:
        for key in ("shard_then_resume", "stale_step"):
            assert "\n" not in rec[key] and "shard=shard)" in rec[key], key
        assert "fully_shard has already sharded 'model'" in rec["shard_then_resume"]
        assert rec["shard_then_resume"].endswith("nothing was changed")
        assert "would train nothing" in rec["stale_step"]
        assert rec["shard_then_resume_unchanged"] and rec["stale_step_unchanged"]
        assert "already sharded (fully_shard)" in rec["shard_twice"]


def test_shard_needs_a_process_group():
    model, opt, sched = build(seed=0)
    groups_before = [list(g["params"]) for g in opt.param_groups]
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    with pytest.raises(torchmagic.TorchMagicError, match="init_process_group first"):
        tm.shard(lambda m: None)
    assert [list(g["params"]) for g in opt.param_groups] == groups_before


if __name__ == "__main__":
    # the worker from the module under its own name, so that Net is the class the
    # notebook side saved (test_fsdp_resume.Net, not __main__.Net)
    import test_fsdp_resume

    test_fsdp_resume._worker(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
