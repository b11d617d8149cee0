"""Sharded tensors and distributed wrappers in this process: a one-rank gloo group (a file
store in the test's folder, destroyed after each test), so FSDP2's DTensors and DDP are
real and fast. The two-rank runs, against the same runs by hand, are in
test_fsdp_resume.py and test_resume_distributed.py (slow)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from torch import nn

import torchmagic
from torchmagic.core import dtensors
from torchmagic.core.surgery.transaction import Transaction


@pytest.fixture
def group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )


def shard(model: nn.Module) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).square().mean().backward()
    opt.step()
    opt.zero_grad()


def snapshot(opt: torch.optim.Optimizer) -> tuple[list, list, dict]:
    return (
        [list(g["params"]) for g in opt.param_groups],
        [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()},
    )


def same(opt: torch.optim.Optimizer, before: tuple[list, list, dict]) -> bool:
    members, settings, state = before
    now = snapshot(opt)
    return (
        len(now[0]) == len(members)
        and all(
            len(a) == len(b) and all(p is q for p, q in zip(a, b, strict=True))
            for a, b in zip(now[0], members, strict=True)
        )
        and now[1] == settings
        and now[2].keys() == state.keys()
        and all(
            type(v) is type(state[i][k]) and torch.equal(full(v), full(state[i][k]))
            for i, s in now[2].items()
            for k, v in s.items()
        )
    )


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if dtensors.is_dtensor(t) else t


# -- DTensors in the history ---------------------------------------------------------


def test_a_dtensors_host_copy_comes_back_as_the_same_dtensor(group):
    model = net()
    shard(model)
    weight = model[0].weight
    kept = dtensors.to_host(weight.detach())
    back = dtensors.from_host(kept, "cpu")
    assert dtensors.is_dtensor(back) and back.placements == weight.placements
    assert back.shape == weight.shape and torch.equal(back.full_tensor(), weight.full_tensor())
    assert dtensors.held(kept).untyped_storage().nbytes() == 16 * 8 * 4
    assert [size for _, size in dtensors.storages(weight)] == [16 * 8 * 4]
    with pytest.raises(RuntimeError, match="invalid python storage"):
        weight.untyped_storage().data_ptr()  # what the history used to call


def test_freeze_after_a_step_on_a_fully_shard_model_counts_its_shards_and_undoes_exactly(group):
    model = net()
    shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tm = torchmagic.Session(model, opt)
    step(model, opt)
    before = snapshot(opt)
    held = sum(
        full(v).untyped_storage().nbytes()
        for p in model[0].parameters()
        for v in opt.state[p].values()
    )
    tm.freeze("0")
    assert [p.requires_grad for p in model[0].parameters()] == [False, False]
    assert all(p not in opt.state for p in model[0].parameters())
    assert not any(
        p is q for g in opt.param_groups for p in g["params"] for q in model[0].parameters()
    )
    assert tm.history_bytes() == held == (16 * 8 + 16) * 4 * 2 + 2 * 4  # moments + steps
    tm.undo()
    assert same(opt, before) and all(p.requires_grad for p in model.parameters())
    assert dtensors.is_dtensor(opt.state[model[0].weight]["exp_avg"])


def test_a_failure_at_the_commit_point_changes_nothing(monkeypatch):
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, opt)
    tm = torchmagic.Session(model, opt)
    before = snapshot(opt)

    def unreadable(self, device_type=None):
        raise RuntimeError("Attempted to access the data pointer on an invalid python storage.")

    monkeypatch.setattr(Transaction, "nbytes", unreadable)
    with pytest.raises(RuntimeError, match="invalid python storage"):
        tm.freeze("0")
    assert same(opt, before) and all(p.requires_grad for p in model.parameters())
    assert tm.history() == ()


# -- shard ---------------------------------------------------------------------------


def test_shard_moves_the_optimizer_onto_the_shards(group):
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tm = torchmagic.Session(model, opt)
    step(model, opt)
    tm.freeze("0")
    state = {
        n: {k: v.clone() for k, v in opt.state[p].items()}
        for n, p in model.named_parameters()
        if p in opt.state
    }
    first = opt.param_groups[0]
    report = tm.shard(shard)
    assert opt.param_groups[0] is first
    assert all(dtensors.is_dtensor(p) for g in opt.param_groups for p in g["params"])
    assert {n for n, p in model.named_parameters() if p in opt.state} == state.keys()
    for name, p in model.named_parameters():
        for key, value in state.get(name, {}).items():
            assert torch.equal(full(opt.state[p][key]), value), (name, key)
    assert (report.parameters, report.sharded, report.groups, report.states) == (6, 6, 1, 4)
    assert report.world_size == 1


def test_shard_puts_the_optimizer_back_when_the_state_cannot_move(group):
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, opt)
    tm = torchmagic.Session(model, opt)
    before = snapshot(opt)

    def fails(state_dict):
        raise RuntimeError("lost the connection")

    opt.load_state_dict = fails  # after DCP's step at lr 0 and its new state
    with pytest.raises(RuntimeError, match="lost the connection"):
        tm.shard(shard)
    assert same(opt, before)


def test_shard_refuses_before_anything_changes(group):
    model = net()
    opt = torch.optim.SGD([*model.parameters(), nn.Parameter(torch.zeros(2))], lr=0.1)
    tm = torchmagic.Session(model, opt)
    called = []
    with pytest.raises(torchmagic.TorchMagicError, match="1 tensors that are not parameters"):
        tm.shard(called.append)
    assert not called
    with pytest.raises(torchmagic.TorchMagicError, match="sharded nothing"):
        torchmagic.Session(net(), None).shard(lambda m: None)


def test_resume_then_a_hand_fully_shard_refuses_the_step(group, tmp_path):
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, opt)
    torchmagic.Session(model, opt).save(tmp_path / "run.pt")
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torchmagic.resume(tmp_path / "run.pt", model, opt)
    step(model, opt)  # unsharded: the guard lets it pass
    shard(model)
    model(torch.randn(2, 8)).sum().backward()
    before = snapshot(opt)
    with pytest.raises(torchmagic.TorchMagicError, match="would train nothing"):
        opt.step()
    assert same(opt, before)


def test_a_sharded_model_is_not_saved_as_one_file(group, tmp_path):
    model = net()
    tm = torchmagic.Session(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    tm.shard(shard)
    with pytest.raises(torchmagic.TorchMagicError, match="fully_shard has sharded it") as refusal:
        tm.save(tmp_path / "run.pt")
    assert "torch.distributed.checkpoint" in str(refusal.value) and "\n" not in str(refusal.value)
    assert list(tmp_path.iterdir()) == [tmp_path / "store"]


# -- DDP wrappers the session was not given -------------------------------------------


def test_a_wrapper_made_after_the_session_is_guarded_until_rewrap(group):
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tm = torchmagic.Session(model, opt)
    ddp = nn.parallel.DistributedDataParallel(model)
    (note,) = tm.freeze("0").effect.notes
    assert "the session was not given" in note
    with pytest.raises(torchmagic.TorchMagicError, match="trainable parameters changed") as info:
        ddp(torch.randn(2, 8))
    # the call it names works as written: the wrapper's variable, never the module's
    assert "ddp_model = torchmagic.rewrap(ddp_model)" in str(info.value)
    with torch.no_grad():
        ddp(torch.randn(2, 8))
    ddp = torchmagic.rewrap(ddp)
    ddp(torch.randn(2, 8)).sum().backward()
    assert model[0].weight.grad is None and model[2].weight.grad is not None


def test_the_refused_forward_names_the_wrapper_variable(group):
    model = net()
    namespace = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    namespace["wrapped"] = nn.parallel.DistributedDataParallel(model)
    tm = torchmagic.Session(namespace=namespace)
    tm.freeze("model.0")
    with pytest.raises(torchmagic.TorchMagicError) as info:
        namespace["wrapped"](torch.randn(2, 8))
    assert "wrapped = torchmagic.rewrap(wrapped)" in str(info.value)
    rewrapped = torchmagic.rewrap(namespace["wrapped"])
    tm.unfreeze("model.0")
    with pytest.raises(torchmagic.TorchMagicError) as again:
        rewrapped(torch.randn(2, 8))
    assert "wrapped = torchmagic.rewrap(wrapped)" in str(again.value)


def test_outside_a_process_group_no_object_is_scanned(monkeypatch):
    model = net()
    tm = torchmagic.Session(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def scanned(*args):
        raise AssertionError("gc.get_objects called")

    monkeypatch.setattr(gc, "get_objects", scanned)
    assert tm.freeze("0").effect.notes == ()
