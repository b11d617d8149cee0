"""Surgery on models of thousands of blocks costs work linear in the model: asserted on
the number of Python calls a command makes (deterministic, unlike time) at two sizes.
Also the undo history's byte cap: its rule, and the last command always undoable."""

import sys
from collections import Counter

import pytest
import torch
from torch import nn

from torchmagic import Session, SessionConfig
from torchmagic.core.surgery import history
from torchmagic.core.surgery.history import MIN_CAP, byte_cap

SMALL, LARGE = 150, 600  # blocks; LARGE = 4 × SMALL


def _blocks(n: int) -> tuple[nn.Module, torch.optim.Optimizer, Session]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, Session(model, opt)


def _calls(action) -> int:
    """Python and C function calls made by ``action()``, and Python lines run (each turn
    of a comprehension is a line: a loop inside one call counts too)."""
    counts: Counter = Counter()

    def profile(frame, event, arg) -> None:
        counts[event] += 1

    def trace(frame, event, arg):
        counts["lines"] += event == "line"
        return trace

    sys.setprofile(profile)
    sys.settrace(trace)
    try:
        action()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return counts["call"] + counts["c_call"] + counts["lines"]


# Each scenario: commands run untimed to set the state up, then the one counted.
SCENARIOS = {
    "freeze half": ([], lambda n, tm: tm.freeze(f"0-{n // 2 - 1}")),
    "unfreeze that half": (
        [lambda n, tm: tm.freeze(f"0-{n // 2 - 1}")],
        lambda n, tm: tm.unfreeze(f"0-{n // 2 - 1}"),
    ),
    "freeze all but the last": ([], lambda n, tm: tm.freeze("model", exclude=[str(n - 1)])),
    "spread over every block, from one group": (
        [],
        lambda n, tm: tm.unfreeze(f"0-{n - 1}", lr=(1e-5, 1e-3)),
    ),
    "spread over every block, frozen": (
        [lambda n, tm: tm.freeze("model", exclude=[str(n - 1)])],
        lambda n, tm: tm.unfreeze(f"0-{n - 1}", lr=(1e-5, 1e-3)),
    ),
    "undo of a spread": (
        [lambda n, tm: tm.unfreeze(f"0-{n - 1}", lr=(1e-5, 1e-3))],
        lambda n, tm: tm.undo(),
    ),
    "summary": ([], lambda n, tm: tm.summary()),
}
SCHEDULED = "spread over every block, under a scheduler"


def _count(scenario: str, n: int) -> int:
    if scenario == SCHEDULED:
        model, opt, _ = _blocks(n)
        tm = Session(model, opt, schedulers=[torch.optim.lr_scheduler.StepLR(opt, 10)])
        return _calls(lambda: tm.unfreeze(f"0-{n - 1}", lr=(1e-5, 1e-3)))
    setup, command = SCENARIOS[scenario]
    _, _, tm = _blocks(n)
    for step in setup:
        step(n, tm)
    return _calls(lambda: command(n, tm))


@pytest.mark.parametrize("scenario", [*SCENARIOS, SCHEDULED])
def test_surgery_work_grows_linearly_with_the_blocks(scenario):
    """4× the blocks: about 4× the calls (quadratic work would be 16×)."""
    small, large = _count(scenario, SMALL), _count(scenario, LARGE)
    assert large / small < 4.25, (scenario, small, large)


def test_a_spread_over_every_block_makes_one_group_each_and_undoes_exactly():
    n = LARGE
    model, opt, tm = _blocks(n)
    params = list(model.parameters())
    tm.unfreeze(f"0-{n - 1}", lr=(1e-5, 1e-3))
    groups = opt.param_groups
    assert len(groups) == 1 + n and groups[0]["params"] == []
    for i, group in enumerate(groups[1:]):
        assert group["name"] == str(i)
        assert group["params"][0] is model[i].weight and group["params"][1] is model[i].bias
    assert groups[1]["lr"] == pytest.approx(1e-5) and groups[-1]["lr"] == pytest.approx(1e-3)
    opt.state_dict()
    tm.undo()
    assert len(opt.param_groups) == 1
    assert all(a is b for a, b in zip(opt.param_groups[0]["params"], params, strict=True))


def test_a_group_emptied_later_in_the_same_command_is_not_reused_early():
    """Parameters leave their groups as each block is placed: a group named after block
    ``b`` that still holds block ``c``'s parameters when ``b`` is placed is not reused
    for ``b`` (``c`` leaves it only after)."""
    model = nn.Sequential()
    for name in "abc":
        model.add_module(name, nn.Linear(2, 2))
    a, b, c = (list(model.get_submodule(x).parameters()) for x in "abc")
    opt = torch.optim.SGD([{"params": a + b}, {"params": c, "name": "b"}], lr=0.1)
    tm = Session(model, opt)
    tm.unfreeze("a", "b", "c", lr=1e-3)
    names = [g.get("name") for g in opt.param_groups]
    assert names == [None, "b", "a", "b", "c"]
    assert opt.param_groups[0]["params"] == [] and opt.param_groups[1]["params"] == []
    assert all(x is y for x, y in zip(opt.param_groups[3]["params"], b, strict=True))


# -- the undo history's byte cap -----------------------------------------------------------


def test_byte_cap_rule():
    gib = 1 << 30
    assert byte_cap(None, 64 * gib).nbytes == 16 * gib  # a quarter of the RAM
    assert "quarter of this machine's 64.0 GiB" in byte_cap(None, 64 * gib).reason
    assert byte_cap(None, 2 * gib).nbytes == MIN_CAP  # at least 1 GiB
    assert byte_cap(None, None).nbytes == MIN_CAP  # RAM unknown
    assert byte_cap(5, 64 * gib) == history.ByteCap(5, "as configured")


def _model() -> tuple[nn.Module, torch.optim.Optimizer, dict]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()  # state to set aside
    return model, opt, {"model": model, "optimizer": opt}


def test_the_automatic_cap_follows_the_machine_memory_and_says_why(monkeypatch):
    model, opt, ns = _model()
    tm = Session(namespace=ns)
    assert tm.config.history_bytes is None
    one_block = sum(
        v.numel() * v.element_size() for p in model[0].parameters() for v in opt.state[p].values()
    )
    # a machine whose quarter holds one block's state: the second freeze drops the first
    monkeypatch.setattr(history, "MIN_CAP", 0)
    monkeypatch.setattr(
        "torchmagic.core.session.undo.machine_memory", lambda: (None, 4 * one_block)
    )
    assert tm.history_cap().nbytes == one_block
    tm.freeze("0")
    notes = tm.freeze("1").effect.notes
    dropped = [n for n in notes if "can no longer be undone" in n]
    assert len(dropped) == 1 and "a quarter of this machine's" in dropped[0]
    assert len(tm.history()) == 1 and tm.history_bytes() <= one_block


@pytest.mark.parametrize("cap", [0, 1, None])
def test_the_last_command_can_always_be_undone(cap, monkeypatch):
    """Whatever the cap (none at all, 1 byte, the automatic one on a tiny machine), after
    every command the newest entry is in the history and undoing it restores exactly."""
    monkeypatch.setattr(history, "MIN_CAP", 0)
    monkeypatch.setattr("torchmagic.core.session.undo.machine_memory", lambda: (None, 8))
    model, opt, ns = _model()
    tm = Session(namespace=ns, config=SessionConfig(history_bytes=cap))
    commands = [
        lambda: tm.freeze("0-1"),
        lambda: tm.freeze("2"),
        lambda: tm.unfreeze("0", lr=1e-4),
        lambda: tm.replace_head("3", 3),
        lambda: tm.unfreeze("2"),
    ]
    for command in commands:
        before = _state(model, opt)
        command()
        assert tm.history()[-1].live
        tm.undo()
        assert _state(model, opt) == before
        command()  # and on to the next one


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> tuple:
    return (
        tuple((id(p), p.requires_grad) for p in model.parameters()),
        tuple((tuple(id(p) for p in g["params"]), g["lr"]) for g in opt.param_groups),
        frozenset(
            (id(p), k, v.data_ptr())
            for p, s in opt.state.items()
            for k, v in s.items()
            if isinstance(v, torch.Tensor)
        ),
    )
