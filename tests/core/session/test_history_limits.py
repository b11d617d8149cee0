"""Undo and history never hurt later work: undo touches only what its command changed,
refuses when the optimizer was re-created, the log is capped (entries and bytes), can be
cleared, shows its bytes in the memory report, and lets go of rebound models."""

from __future__ import annotations

import gc
import weakref
from collections import OrderedDict

import pytest
import torch
from IPython.utils.capture import capture_output
from torch import nn

from snapshots import assert_same, snapshot
from torchmagic import Session, TorchMagicError
from torchmagic.core import SessionConfig
from torchmagic.core.advice import spelled
from torchmagic.magics.extension import loaded


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        OrderedDict(
            stem=nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
            body=nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
            pool=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(8, 3),
        )
    )


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    opt.step()
    opt.zero_grad()


def setup(config: SessionConfig | None = None):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, opt)
    ns = {"model": model, "optimizer": opt}
    return model, opt, ns, Session(namespace=ns, config=config)


def state_bytes(opt: torch.optim.Optimizer, params) -> int:
    return sum(
        t.untyped_storage().nbytes()
        for p in params
        for t in opt.state[p].values()
        if isinstance(t, torch.Tensor)
    )


def _user_group(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[nn.Module, dict]:
    """The user's own addition after a command: a new layer in a new group, stepped."""
    extra = nn.Linear(8, 8)
    opt.add_param_group({"params": list(extra.parameters()), "lr": 5e-3})
    group = opt.param_groups[-1]
    extra(torch.randn(2, 8)).sum().backward()
    opt.step()
    return extra, group


# -- undo touches only what the command changed ------------------------------------------


def test_undo_of_freeze_keeps_the_group_the_user_added_and_its_state():
    model, opt, ns, tm = setup()
    tm.freeze("body")
    extra, group = _user_group(model, opt)
    exp_avg = opt.state[extra.weight]["exp_avg"]
    tm.undo()
    assert any(g is group for g in opt.param_groups)
    assert [id(p) for p in group["params"]] == [id(extra.weight), id(extra.bias)]
    assert opt.state[extra.weight]["exp_avg"] is exp_avg
    assert all(p.requires_grad for p in model.body.parameters())
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert all(id(p) in held for p in model.parameters())


def test_undo_of_unfreeze_drops_its_own_group_but_not_the_users():
    model, opt, ns, tm = setup()
    tm.freeze("body")
    tm.unfreeze("body", lr=1e-3)
    ours = opt.param_groups[-1]
    step(model, opt)
    extra, group = _user_group(model, opt)
    tm.undo()
    assert not any(g is ours for g in opt.param_groups)
    assert opt.param_groups[-1] is group
    assert "exp_avg" in opt.state[extra.weight]
    assert not any(p.requires_grad for p in model.body.parameters())
    assert all(p not in opt.state for p in model.body.parameters())


def test_undo_refuses_when_a_user_group_holds_what_the_command_took_out():
    model, opt, ns, tm = setup()
    tm.freeze("body")
    opt.add_param_group({"params": list(model.body.parameters())})
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="two groups"):
        tm.undo()
    assert_same(before, snapshot(model, opt))
    assert len(tm.history()) == 1


# -- a re-created optimizer --------------------------------------------------------------


def test_undo_refuses_after_the_optimizer_was_recreated():
    model, opt, ns, tm = setup()
    tm.freeze("body")
    ns["optimizer"] = new = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-3
    )
    before = snapshot(model, new)
    with pytest.raises(TorchMagicError, match="re-created"):
        tm.undo()
    assert_same(before, snapshot(model, new))
    assert not any(p.requires_grad for p in model.body.parameters())
    (entry,) = tm.history()
    assert not entry.live and entry.stale == "optimizer re-created"


def test_undo_refuses_when_an_optimizer_appeared_since_a_command_without_one():
    model = make_model()
    ns = {"model": model}
    tm = Session(namespace=ns)
    tm.freeze("body")
    ns["optimizer"] = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with pytest.raises(TorchMagicError, match="ran without an optimizer"):
        tm.undo()
    assert not any(p.requires_grad for p in model.body.parameters())
    del ns["optimizer"]
    tm.undo()
    assert all(p.requires_grad for p in model.body.parameters())


def test_undo_goes_ahead_when_the_optimizer_made_since_holds_every_parameter():
    """`del optimizer`, a freeze, `optimizer = SGD(model.parameters())` (frozen ones too):
    undoing the freeze trains only what the new optimizer holds, so it is not refused."""
    model = make_model()
    ns = {"model": model}
    tm = Session(namespace=ns)
    tm.freeze("body")
    ns["optimizer"] = new = torch.optim.SGD(model.parameters(), lr=0.1)
    tm.undo()
    assert all(p.requires_grad for p in model.parameters())
    held = new.param_groups[0]["params"]
    assert len(held) == len(list(model.parameters()))
    assert all(any(p is q for q in held) for p in model.parameters())  # by identity
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    new.step()
    # every parameter trains (it has a gradient); those whose gradient is clearly non-zero
    # moved. A conv bias before a BatchNorm has a zero gradient in exact arithmetic (BN
    # removes the mean), so whether its float changes is the CPU's rounding: not asserted.
    assert all(p.grad is not None for p in model.parameters())
    clear = {n for n, p in model.named_parameters() if p.grad.abs().max() > 1e-3}
    assert {"body.0.weight", "fc.weight", "fc.bias"} <= clear
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in clear)


def test_undo_of_an_unfreeze_without_optimizer_refuses_when_the_new_one_holds_the_block():
    model = make_model()
    ns = {"model": model}
    tm = Session(namespace=ns)
    tm.freeze("body")
    tm.unfreeze("body")
    ns["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TorchMagicError, match="no longer train"):
        tm.undo()
    assert all(p.requires_grad for p in model.body.parameters())


# -- the cap -----------------------------------------------------------------------------


def test_history_limit_drops_the_oldest_with_a_note():
    model, opt, ns, tm = setup(SessionConfig(history_limit=2))
    assert not tm.freeze("stem").effect.notes
    tm.freeze("body")
    change = tm.unfreeze("stem")
    assert any("the oldest 1 command can no longer be undone" in n for n in change.effect.notes)
    commands = [spelled(e.command) for e in tm.history()]
    assert commands == ['tm.freeze("body")', 'tm.unfreeze("stem")']
    tm.undo()
    tm.undo()
    with pytest.raises(TorchMagicError, match="nothing to undo"):
        tm.undo()
    assert all(p.requires_grad for p in model.body.parameters())
    assert not any(p.requires_grad for p in model.stem.parameters())  # its freeze was dropped


def test_history_bytes_cap_bounds_the_log_over_freeze_unfreeze_cycles():
    cycles = 6
    model, opt, ns, tm = setup()
    layer = list(model.body.parameters())
    per_cycle = state_bytes(opt, layer)
    sizes = []
    for _ in range(cycles):
        tm.freeze("body")
        tm.unfreeze("body")
        step(model, opt)
        sizes.append(tm.history_bytes())
    # without a cap each freeze keeps the layer's optimizer state for undo
    growth = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert growth == [per_cycle] * (cycles - 1)

    cap = 2 * per_cycle
    model, opt, ns, tm = setup(SessionConfig(history_bytes=cap))
    notes = []
    for _ in range(cycles):
        notes += tm.freeze("body").effect.notes
        tm.unfreeze("body")
        step(model, opt)
        assert tm.history_bytes() <= cap
    assert any("can no longer be undone" in n for n in notes)


def test_the_newest_command_stays_undoable_over_the_byte_cap():
    model, opt, ns, tm = setup(SessionConfig(history_bytes=0))
    tm.freeze("stem")
    change = tm.freeze("body")
    assert any("oldest 1 command" in n for n in change.effect.notes)
    assert len(tm.history()) == 1
    tm.undo()
    assert all(p.requires_grad for p in model.body.parameters())


def test_clear_history_releases_the_log():
    model, opt, ns, tm = setup()
    expected = state_bytes(opt, model.body.parameters())
    tm.freeze("body")
    assert tm.history_bytes() == expected  # the layer's optimizer state, set aside
    assert tm.memory().history_bytes == expected  # CPU: all of it is on the host
    cleared = tm.clear_history()
    assert (cleared.commands, cleared.nbytes) == (1, expected)
    assert tm.history() == () and tm.memory().history_bytes == 0
    with pytest.raises(TorchMagicError, match="nothing to undo"):
        tm.undo()


# -- rebound models ----------------------------------------------------------------------


def test_records_of_rebound_models_let_them_go():
    ns: dict = {}
    tm = Session(namespace=ns)
    refs = []
    for seed in range(3):
        model = make_model(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step(model, opt)
        ns.update(model=model, optimizer=opt)
        tm.freeze("body", command=f"freeze {seed}")
        refs.append(weakref.ref(model))
    del model, opt
    entries = tm.history()
    gc.collect()
    assert [r() is None for r in refs] == [True, True, False]
    assert [(e.live, e.stale) for e in entries] == [
        (False, "model rebound"),
        (False, "model rebound"),
        (True, ""),
    ]
    tm.undo()  # the bound model's command; the stale ones are skipped
    with pytest.raises(TorchMagicError, match="nothing to undo"):
        tm.undo()


# -- the magics --------------------------------------------------------------------------


def test_magics_clear_config_memory_line_and_rebinding(ip):
    ip.run_cell(
        "import torch\nfrom torch import nn\n"
        "def make():\n"
        "    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
        "    o = torch.optim.AdamW(m.parameters())\n"
        "    m(torch.randn(3, 4)).sum().backward(); o.step()\n"
        "    return m, o\n"
        "model, optimizer = make()\n"
    ).raise_error()
    ip.run_line_magic("config", "TorchMagics.history_limit = 7")
    session = loaded(ip).session
    assert session.config.history_limit == 7
    with capture_output():
        ip.run_line_magic("replace_head", "5")  # its undo log holds the model (the parent)
    first = weakref.ref(ip.user_ns["model"])
    with capture_output() as cap:
        ip.run_line_magic("gpumem", "")
    assert "the undo history holds" in cap.outputs[0].data["text/plain"]
    ip.run_cell("model, optimizer = make()").raise_error()  # post_run_cell lets go
    gc.collect()
    assert first() is None
    with capture_output() as cap:
        ip.run_line_magic("tm", "clear")
    assert "1 command(s) forgotten" in cap.outputs[0].data["text/plain"]
    assert session.history() == ()
