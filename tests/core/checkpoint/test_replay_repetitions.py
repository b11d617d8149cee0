"""A resume does not run again the commands that repeat a run from the same structure, and
ends exactly where running every command ends: weights, flags, groups, optimizer and
scheduler state, home groups, BatchNorm policies, class names and the history."""

from __future__ import annotations

import copy

import pytest
import torch

import torchmagic
from checkpoint_helpers import assert_same, build_net, loader, state, structure, train
from torchmagic.core.advice import spelled
from torchmagic.core.registry import REGISTRY
from torchmagic.core.session import replay, save_load


def _session_with_repetitions(tmp_path):
    """Cycles of commands between other commands, with training in between, saved."""
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    tm.freeze("stem")
    for _ in range(6):  # freeze / unfreeze home
        tm.freeze("layer1")
        tm.unfreeze("layer1")
    tm.replace_head("fc", 4, labels=["a", "b", "c", "d"])
    for _ in range(4):  # a three-command cycle, with groups of their own
        tm.freeze("layer2", bn="frozen")
        tm.unfreeze("layer2", lr=1e-3)
        tm.freeze("layer2")
    tm.unfreeze("layer2", lr=3e-4)
    train(model, opt, loader(), sched.step)
    for _ in range(5):  # heads replaced again and again: new parameters each time
        tm.replace_head("fc", 4, labels=["a", "b", "c", "d"])
    tm.freeze("layer1", bn="train")
    train(model, opt, loader(), sched.step)
    path = tmp_path / "cycles.pt"
    tm.save(path)
    return path, tm


def _resumed(path, full: bool, monkeypatch) -> tuple:
    """Resume ``path`` into a fresh build; ``full``: with every command run (no structure
    ever seen twice). Returns the session, its objects and how many commands ran."""
    with monkeypatch.context() as patch:
        if full:
            patch.setattr(replay, "structure", lambda session, target: object())
        ran = []
        real = save_load._replay_call
        patch.setattr(
            save_load, "_replay_call", lambda *args: (ran.append(args[3]), real(*args))[1]
        )
        model, opt, sched = build_net(seed=3)
        tm = torchmagic.resume(path, model, opt, [sched])
    return tm, model, opt, sched, len(ran)


def _homes(model, opt) -> list:
    index = REGISTRY.homes[opt].indexer(opt)
    return [index(p) for _, p in model.named_parameters()]


def _listed(tm) -> list:
    return [(e.index, e.command, e.action, e.modules, e.stale, e.replay) for e in tm.history()]


def test_a_resume_skips_repetitions_and_ends_as_running_every_command(tmp_path, monkeypatch):
    path, original = _session_with_repetitions(tmp_path)
    commands = len(torch.load(path, weights_only=True)["history"])
    fast, model, opt, sched, ran = _resumed(path, full=False, monkeypatch=monkeypatch)
    slow, model2, opt2, sched2, ran_all = _resumed(path, full=True, monkeypatch=monkeypatch)
    assert ran_all == commands == 33
    assert ran < commands - 10  # the repetitions were copied, not run
    assert_same(structure(model, opt), structure(model2, opt2))
    assert_same(state(model, opt), state(model2, opt2))
    assert sched.state_dict() == sched2.state_dict()
    assert opt.state_dict()["param_groups"] == opt2.state_dict()["param_groups"]
    assert _homes(model, opt) == _homes(model2, opt2)
    assert _listed(fast) == _listed(slow)
    assert [e.command for e in fast.history()] == [spelled(e.command) for e in original.history()]
    assert fast._history.applied(model) and len(fast._history.applied(model)) == commands
    assert fast.class_names.given(model) == slow.class_names.given(model2) == ("a", "b", "c", "d")
    for m1, m2 in zip(model.modules(), model2.modules(), strict=True):
        assert type(m1) is type(m2) and m1.training == m2.training
    rng = torch.get_rng_state()  # and they go on alike (dropout, shuffling: same draws)
    train(model, opt, loader(), sched.step)
    torch.set_rng_state(rng)
    train(model2, opt2, loader(), sched2.step)
    assert_same(state(model, opt), state(model2, opt2))


def test_a_failed_resume_after_copied_records_changes_nothing_and_a_retry_works(
    tmp_path, monkeypatch
):
    """The check after the replay refuses: the replayed commands are undone and the
    copied records taken out; the same objects then resume."""
    path, _ = _session_with_repetitions(tmp_path)
    model, opt, sched = build_net(seed=3)
    before = structure(model, opt), state(model, opt), copy.deepcopy(sched.state_dict())

    def refuse(payload, where, target):
        raise torchmagic.TorchMagicError(f"cannot resume from '{where}': refused for the test")

    with monkeypatch.context() as patch:
        patch.setattr(save_load.checkpoint_file, "check_replayed", refuse)
        with pytest.raises(torchmagic.TorchMagicError, match="refused for the test"):
            torchmagic.resume(path, model, opt, [sched])
    assert_same(before[0], structure(model, opt))
    assert_same(before[1], state(model, opt))
    assert sched.state_dict() == before[2]
    assert type(model.layer2[1]).__name__ == "BatchNorm2d"
    tm = torchmagic.resume(path, model, opt, [sched])
    assert len(tm.history()) == 33


def test_with_an_ema_copy_every_command_runs_and_the_copy_ends_as_the_models(
    tmp_path, monkeypatch
):
    """A replaced head is replaced in the EMA copy too, with the weights it drew; the file
    holds the model's, not the copy's: so nothing is copied, every command runs."""
    model, opt, sched = build_net()
    ema = torch.optim.swa_utils.AveragedModel(model)
    tm = torchmagic.Session(namespace={"model": model, "opt": opt, "sched": sched, "ema": ema})
    for _ in range(3):
        tm.replace_head("model.fc", 4)
        tm.freeze("model.layer1")
        tm.unfreeze("model.layer1")
    tm.save(tmp_path / "ema.pt")
    fresh, fresh_opt, fresh_sched = build_net(seed=3)
    fresh_ema = torch.optim.swa_utils.AveragedModel(fresh)
    ran = []
    real = save_load._replay_call
    monkeypatch.setattr(
        save_load, "_replay_call", lambda *args: (ran.append(args[3]), real(*args))[1]
    )
    ns = {"model": fresh, "opt": fresh_opt, "sched": fresh_sched, "ema": fresh_ema}
    torchmagic.Session(namespace=ns).load(tmp_path / "ema.pt", model="model")
    assert len(ran) == 9
    assert fresh_ema.module.fc.out_features == 4
    assert_same(structure(model, opt), structure(fresh, fresh_opt))
