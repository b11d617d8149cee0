"""timm's Lookahead keeps every per-parameter state in its base optimizer (the base's
moments and its own slow weights, ``_base_optimizer.state``) and shares the base's
``param_groups`` list. Each command on a session holding one is compared bit for bit with
the same edit by hand (the base's state set aside as torchmagic does for a plain AdamW),
in this process, from the same seed and on the same inputs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from timm.optim import Lookahead, create_optimizer_v2
from torch import nn
from torch.distributed.tensor import DTensor

import torchmagic
from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.core.devices import batch_size, device
from torchmagic.core.devices.batch_size import find_batch_size
from torchmagic.core.tensors import nbytes, state_bytes

STEPS = 5  # odd, with k=2: a command falls between two slow updates


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _lookahead(model: nn.Module) -> Lookahead:
    return Lookahead(torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05), k=2)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = STEPS, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _base(opt: Lookahead) -> torch.optim.Optimizer:
    return opt._base_optimizer


def _by_name(model: nn.Module, opt: Lookahead) -> dict:
    """Everything the next steps depend on, by parameter name: weights, flags, buffers,
    the groups (members and settings) and every state tensor of the base optimizer."""
    names = {id(p): n for n, p in model.named_parameters()}
    state = _base(opt).state
    assert not opt.state  # the Lookahead's own dict stays unused
    assert opt.param_groups is _base(opt).param_groups
    return {
        "weights": {n: (p.requires_grad, p.detach().clone()) for n, p in model.named_parameters()},
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
        "groups": [
            (
                [names[id(p)] for p in g["params"]],
                {k: v for k, v in g.items() if k != "params"},
            )
            for g in opt.param_groups
        ],
        "state": {
            names[id(p)]: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for p, s in state.items()
        },
    }


def _set_aside(opt: Lookahead, params: list[nn.Parameter]) -> None:
    """A freeze by hand: out of their groups, their base state set aside, no gradient."""
    ids = {id(p) for p in params}
    for group in opt.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in ids]
    for p in params:
        _base(opt).state.pop(p, None)
        p.requires_grad_(False)
        p.grad = None


Edit = Callable[[Session, nn.Sequential, Lookahead], object]


def _both(by_session: Edit, by_hand: Edit) -> list[tuple[nn.Sequential, Lookahead]]:
    """Train, edit, train on two identical setups: one edited by a session, one by hand
    (given the session, unused). Returns both (model, optimizer) after the last steps."""
    runs = []
    for edit in (by_session, by_hand):
        model = _model()
        opt = _lookahead(model)
        _train(model, opt)
        edit(Session(model, opt), model, opt)
        _train(model, opt, seed=2)
        runs.append((model, opt))
    return runs


def _cycle_first_layer_by_hand(model: nn.Sequential, opt: Lookahead) -> None:
    """By hand: the first layer frozen, some steps, back into its home group (fresh)."""
    params = list(model[0].parameters())
    home = opt.param_groups[0]
    _set_aside(opt, params)
    _train(model, opt, seed=3)
    for p in params:
        p.requires_grad_(True)
    home["params"] = [*home["params"], *params]


def test_freeze_sets_the_base_state_aside_and_unfreeze_starts_fresh_as_by_hand():
    """Before, the base's moments and slow weights of a frozen block stayed and an
    unfreeze resumed them: stale by the frozen steps."""

    def by_session(tm: Session, model: nn.Sequential, opt: Lookahead) -> None:
        tm.freeze("0")
        _train(model, opt, seed=3)
        tm.unfreeze("0")

    def by_hand(_: Session, model: nn.Sequential, opt: Lookahead) -> None:
        _cycle_first_layer_by_hand(model, opt)

    (model, opt), (hand_model, hand_opt) = _both(by_session, by_hand)
    assert_same(_by_name(model, opt), _by_name(hand_model, hand_opt))
    assert "lookahead_slow_buff" in _base(opt).state[model[0].weight]


def test_freeze_leaves_the_base_optimizer_without_the_frozen_state():
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    before = state_bytes(_base(opt))
    assert state_bytes(opt) == before > 0  # the byte count sees the base's state
    Session(model, opt).freeze("0")
    frozen = list(model[0].parameters())
    assert all(p not in _base(opt).state for p in frozen)
    assert all(p in _base(opt).state for p in model[3].parameters())
    assert state_bytes(opt) == state_bytes(_base(opt)) < before


def test_unfreeze_with_an_lr_makes_a_group_in_phase_with_its_home_as_by_hand():
    """The new group copies its home group's settings, the lookahead count included, so
    its slow update comes at the same steps as the rest of the model's."""

    def by_session(tm: Session, model: nn.Sequential, opt: Lookahead) -> None:
        tm.freeze("0")
        _train(model, opt, seed=3)
        tm.unfreeze("0", lr=1e-3)

    def by_hand(_: Session, model: nn.Sequential, opt: Lookahead) -> None:
        params = list(model[0].parameters())
        _set_aside(opt, params)
        _train(model, opt, seed=3)
        for p in params:
            p.requires_grad_(True)
        home = opt.param_groups[0]
        settings = {k: v for k, v in home.items() if k not in ("params", "lr")}
        opt.add_param_group({**settings, "params": params, "lr": 1e-3, "name": "0"})

    (model, opt), (hand_model, hand_opt) = _both(by_session, by_hand)
    assert [g["lookahead_step"] for g in opt.param_groups] == [2 * STEPS + STEPS] * 2
    assert_same(_by_name(model, opt), _by_name(hand_model, hand_opt))


def test_timm_create_optimizer_groups_survive_a_freeze_cycle_as_by_hand():
    """``create_optimizer_v2(model, "lookahead_adamw")``: timm's decay / no-decay groups,
    each block going back to its own."""
    runs = []
    for by_hand in (False, True):
        model = _model()
        opt = create_optimizer_v2(model, "lookahead_adamw", lr=1e-2, weight_decay=0.05)
        assert isinstance(opt, Lookahead) and len(opt.param_groups) == 2
        _train(model, opt)
        if by_hand:
            params = list(model[0].parameters())
            homes = [
                next(g for g in opt.param_groups if any(q is p for q in g["params"]))
                for p in params
            ]
            _set_aside(opt, params)
            _train(model, opt, seed=3)
            for p, home in zip(params, homes, strict=True):
                p.requires_grad_(True)
                home["params"] = [*home["params"], p]
        else:
            tm = Session(model, opt)
            tm.freeze("0")
            _train(model, opt, seed=3)
            tm.unfreeze("0")
        _train(model, opt, seed=2)
        runs.append(_by_name(model, opt))
    assert_same(*runs)


@pytest.mark.parametrize("command", ["freeze", "unfreeze", "replace_head"])
def test_undo_puts_the_base_state_back_exactly(command):
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    tm = Session(model, opt)
    if command == "unfreeze":
        tm.freeze("0")
        _train(model, opt, seed=3)
    before = snapshot(model, _base(opt))
    {
        "freeze": lambda: tm.freeze("0"),
        "unfreeze": lambda: tm.unfreeze("0", lr=1e-3),
        "replace_head": lambda: tm.replace_head("3", 5),
    }[command]()
    assert not opt.state
    tm.undo()
    assert_same(before, snapshot(model, _base(opt)))
    assert opt.param_groups is _base(opt).param_groups


def test_replace_head_puts_the_new_head_in_the_old_heads_group_with_no_state():
    def by_session(tm: Session) -> None:
        tm.replace_head("3", 5)

    def by_hand(model: nn.Sequential, opt: Lookahead) -> None:
        old = list(model[3].parameters())
        group = opt.param_groups[0]
        _set_aside(opt, old)
        torch.manual_seed(7)
        model[3] = nn.Linear(8, 5)
        group["params"] = [*group["params"], *model[3].parameters()]

    runs = []
    for edit in (by_session, by_hand):
        model = _model()
        opt = _lookahead(model)
        _train(model, opt)
        old = list(model[3].parameters())
        if edit is by_session:
            torch.manual_seed(7)  # the new head's initial weights
            edit(Session(model, opt))
        else:
            edit(model, opt)
        new = list(model[3].parameters())
        assert all(any(q is p for q in opt.param_groups[0]["params"]) for p in new)
        assert not any(p in _base(opt).state for p in [*old, *new])
        _train_five_classes(model, opt)
        runs.append(_by_name(model, opt))
    assert_same(*runs)


def _train_five_classes(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    g = torch.Generator().manual_seed(4)
    for _ in range(STEPS):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_save_and_resume_carry_the_moments_and_slow_weights(tmp_path):
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    tm = Session(model, opt)
    tm.freeze("0")
    _train(model, opt, seed=3)
    tm.unfreeze("0", lr=1e-3)
    _train(model, opt, seed=2, steps=3)  # the groups' counts stand between two updates
    path = tmp_path / "run.pt"
    tm.save(path)

    fresh = _model()
    fresh_opt = _lookahead(fresh)
    torchmagic.resume(path, fresh, fresh_opt)
    saved = _by_name(model, opt)
    assert any("lookahead_slow_buff" in s for s in saved["state"].values())
    assert_same(saved, _by_name(fresh, fresh_opt))
    _train(model, opt, seed=5)
    _train(fresh, fresh_opt, seed=5)
    assert_same(_by_name(model, opt), _by_name(fresh, fresh_opt))


def test_resume_with_another_base_optimizer_is_refused_with_nothing_changed(tmp_path):
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    path = tmp_path / "run.pt"
    Session(model, opt).save(path)
    fresh = _model()
    sgd = Lookahead(torch.optim.SGD(fresh.parameters(), lr=1e-2, momentum=0.9), k=2)
    before = snapshot(fresh, _base(sgd))
    with pytest.raises(TorchMagicError) as info:
        torchmagic.resume(path, fresh, sgd)
    assert_same(before, snapshot(fresh, _base(sgd)))
    message = str(info.value)
    assert "\n" not in message
    assert "SGD in timm.optim.lookahead.Lookahead" in message
    assert "AdamW in timm.optim.lookahead.Lookahead" in message


def test_the_doctor_sees_state_that_a_frozen_tensor_holds_in_the_base():
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    for p in model[0].parameters():
        p.requires_grad_(False)
        p.grad = None
    report = Session(model, opt).doctor()
    found = [f for f in report.findings if f.check == "frozen-in-optimizer"]
    assert len(found) == 1 and "2 frozen tensor(s)" in found[0].message
    assert found[0].nbytes == state_bytes(_base(opt), list(model[0].parameters())) > 0


def test_lr_find_leaves_the_base_state_as_it_was():
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    before = snapshot(model, _base(opt))
    g = torch.Generator().manual_seed(6)
    data = [(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))] * 8
    Session(model, opt).lr_find(data, steps=8)
    assert_same(before, snapshot(model, _base(opt)))


def test_groups_split_from_the_base_are_refused_with_nothing_changed():
    """The base's own ``load_state_dict`` gives it new group dicts the Lookahead does not
    see: an edit of one would miss the other."""
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    base = _base(opt)
    base.load_state_dict(base.state_dict())
    tm = Session(model, opt)
    before = snapshot(model, base), snapshot(model, opt)
    with pytest.raises(TorchMagicError) as info:
        tm.freeze("0")
    assert_same(before[0], snapshot(model, base))
    assert_same(before[1], snapshot(model, opt))
    message = str(info.value)
    assert "\n" not in message and "load_state_dict(state_dict()) on the Lookahead" in message
    opt.load_state_dict(opt.state_dict())  # the way on it names
    tm.freeze("0")
    assert all(p not in base.state for p in model[0].parameters())


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_shard_moves_the_base_state_onto_the_shards_without_a_lookahead_step(one_rank):
    """torch.distributed.checkpoint steps the optimizer it loads at lr 0: given the base,
    that is no lookahead step (a Lookahead's step could pull the weights back)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def shard(model: nn.Module) -> None:
        mesh = init_device_mesh("cpu", (1,))
        for layer in (model[0], model[3]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    model = _model()
    opt = _lookahead(model)
    _train(model, opt, steps=3)
    tm = Session(model, opt)
    tm.freeze("0")
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = _by_name(model, opt)["state"]
    counts = [g["lookahead_step"] for g in opt.param_groups]
    report = tm.shard(shard)
    assert opt.param_groups is _base(opt).param_groups and not opt.state
    assert [g["lookahead_step"] for g in opt.param_groups] == counts == [3]
    assert report.states == len(state) == 4
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in _base(opt).state} == state.keys()
    for p, entries in _base(opt).state.items():
        assert isinstance(p, DTensor)
        for key, value in state[names[id(p)]].items():
            live = entries[key]
            assert torch.equal(live.full_tensor() if isinstance(live, DTensor) else live, value)
    for name, p in model.named_parameters():
        assert torch.equal(p.full_tensor(), weights[name])


def test_compare_devices_times_a_copy_of_the_base_and_leaves_the_live_pair_alone():
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    before = snapshot(model, _base(opt))
    counts = [g["lookahead_step"] for g in opt.param_groups]
    g = torch.Generator().manual_seed(6)
    batch = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    report = Session(model, opt).compare_devices([batch], steps=2)
    assert report.optimizer == "AdamW (the Lookahead's base)" and report.ranked
    assert not opt.state
    assert_same(before, snapshot(model, _base(opt)))
    assert [g["lookahead_step"] for g in opt.param_groups] == counts


def test_the_batch_size_probes_snapshot_puts_the_count_and_the_base_state_back():
    """find_batch_size takes real steps on the live pair on a GPU, then restores them:
    the groups' lookahead counts with the base's state."""
    model = _model()
    opt = _lookahead(model)
    _train(model, opt, steps=3)
    before = snapshot(model, _base(opt))
    taken = batch_size._Snapshot(model, opt)
    _train(model, opt, seed=8, steps=4)
    taken.restore()
    assert_same(before, snapshot(model, _base(opt)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_base_state_moves_is_freed_and_survives_the_batch_size_probe():
    model = _model()
    opt = _lookahead(model)
    _train(model, opt)
    device.move(model, "cuda", opt)
    assert all(s["exp_avg"].device.type == "cuda" for s in _base(opt).state.values())
    assert all(s["lookahead_slow_buff"].is_cuda for s in _base(opt).state.values())
    before = snapshot(model, _base(opt))
    find_batch_size(model, opt, (6,), max_batch=64)
    assert_same(before, snapshot(model, _base(opt)))
    on_gpu = sum(
        nbytes(v)
        for p in model[0].parameters()
        for v in _base(opt).state[p].values()
        if torch.is_tensor(v) and v.is_cuda
    )
    change = Session(model, opt).freeze("0")
    assert change.effect.state_freed_bytes == on_gpu > 0


def test_the_base_bound_to_a_variable_too_is_the_lookaheads_part_not_a_second_optimizer():
    """``base = AdamW(...)``; ``opt = Lookahead(base)``: commands edit the pair once, as
    by hand, and naming the base still edits the same groups without a second copy."""

    def by_session(_: Session, model: nn.Sequential, opt: Lookahead) -> None:
        tm = Session(namespace={"model": model, "base": _base(opt), "opt": opt})
        assert tm.freeze("0").optimizer_name == "opt"
        _train(model, opt, seed=3)
        tm.unfreeze("0")
        tm.freeze("3", optimizer="base")

    def by_hand(_: Session, model: nn.Sequential, opt: Lookahead) -> None:
        _cycle_first_layer_by_hand(model, opt)
        _set_aside(opt, list(model[3].parameters()))

    (model, opt), (hand_model, hand_opt) = _both(by_session, by_hand)
    assert_same(_by_name(model, opt), _by_name(hand_model, hand_opt))
