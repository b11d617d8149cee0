"""Session.save / torchmagic.resume: one file keyed by names, continued bit for bit in a
fresh model, optimizer and scheduler; anything that does not match is refused in one line
with everything left as it was."""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import torchmagic
from checkpoint_helpers import (
    Net,
    assert_same,
    batches,
    build_net,
    build_resnet18,
    loader,
    state,
    structure,
    train,
)
from paths import TESTS
from snapshots import assert_same as assert_unchanged
from snapshots import snapshot
from torchmagic import TorchMagicError
from torchmagic.core.advice import spelled


def surgery(tm: torchmagic.Session, model, opt, sched) -> None:
    tm.freeze("stem", "layer1")
    tm.replace_head("fc", 4)
    train(model, opt, loader(), sched.step)
    tm.unfreeze("layer1", lr=3e-3)
    train(model, opt, loader(), sched.step)


@pytest.fixture
def saved(tmp_path):
    """A session after surgery and training, saved; then trained on in the same process
    (what the notebook would have done next)."""
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    surgery(tm, model, opt, sched)
    path = tmp_path / "run.pt"
    report = tm.save(path)
    return path, report, (model, opt, sched), tm


def test_resume_continues_bit_for_bit(saved):
    path, report, (model, opt, sched), tm = saved
    assert report.nbytes == path.stat().st_size and len(report.commands) == 3
    at_save = structure(model, opt), state(model, opt), sched.state_dict()
    train(model, opt, loader(), sched.step)  # the notebook goes on: shuffles, drops out
    fresh, fresh_opt, fresh_sched = build_net(seed=7)  # other init: every weight is loaded
    resumed = torchmagic.resume(path, fresh, fresh_opt, schedulers=[fresh_sched])
    assert_same(at_save[0], structure(fresh, fresh_opt))
    assert_same(at_save[1], state(fresh, fresh_opt))
    assert fresh_sched.state_dict() == at_save[2]
    train(fresh, fresh_opt, loader(), fresh_sched.step)  # the RNG as it was at the save
    assert_same(structure(model, opt), structure(fresh, fresh_opt))
    assert_same(state(model, opt), state(fresh, fresh_opt))
    assert [spelled(e.command) for e in resumed.history()] == [
        spelled(e.command) for e in tm.history()
    ]
    assert resumed.history()[0].stale == "replayed from a checkpoint"


def test_nothing_points_into_the_file_after_a_resume(saved):
    """The file is read memory-mapped; writing over it in place (a hand-written
    ``torch.save`` to the same path) must not pull the optimizer state away."""
    path, *_ = saved
    fresh, fresh_opt, fresh_sched = build_net()
    torchmagic.resume(path, fresh, fresh_opt, [fresh_sched])
    with open(path, "wb") as stream:  # truncated in place, same inode
        stream.write(b"x")
    train(fresh, fresh_opt, loader(), fresh_sched.step)
    assert all(torch.isfinite(s["exp_avg"]).all() for s in fresh_opt.state.values())


def test_groups_and_homes_follow_the_engine_after_resume(saved):
    """Later commands after a resume do what they would have done in the notebook."""
    path, _, (model, opt, sched), tm = saved
    fresh, fresh_opt, fresh_sched = build_net(seed=7)
    resumed = torchmagic.resume(path, fresh, fresh_opt, schedulers=[fresh_sched])
    for session in (tm, resumed):
        session.unfreeze("stem")  # home: the group it left
        session.freeze("layer2")
    assert_same(structure(model, opt), structure(fresh, fresh_opt))
    assert_same(state(model, opt), state(fresh, fresh_opt))
    assert fresh_sched.base_lrs == sched.base_lrs


def test_the_file_is_plain_and_keyed_by_names(saved):
    path, *_ = saved
    payload = torch.load(path, weights_only=True)
    names = set(payload["model"]["state_dict"])
    assert set(payload["optimizer"]["state"]) <= names
    assert payload["optimizer"]["groups"][1]["params"][0] == "layer1.0.weight"
    assert payload["model"]["heads"] == [
        {
            "path": "fc",
            "class": "torch.nn.modules.linear.Linear",
            "in_features": 8,
            "out_features": 4,
            "bias": True,
            "dropout": None,
        }
    ]
    assert payload["model"]["batchnorm"]["stem.1"] == "held"
    assert [c["python"] for c in payload["history"]] == [
        "tm.freeze('stem', 'layer1', bn='eval')",
        "tm.replace_head('fc', 4)",
        "tm.unfreeze('layer1', lr=0.003)",
    ]
    assert payload["schedulers"][0]["class"].endswith("CosineAnnealingLR")
    assert "torch" in payload["rng"] and "python" in payload["rng"]


def test_resnet18_adamw_cosine_notebook_commands(tmp_path):
    """The issue's case: freeze, a new head, unfreeze lr= — resumed under another variable
    name, continued bit for bit."""

    net, opt, sched = build_resnet18()
    tm = torchmagic.Session(namespace={"net": net, "opt": opt, "sched": sched})
    tm.freeze("net.layer1-3")
    tm.replace_head("net.fc", 5)
    data = batches(2, (2, 3, 32, 32), 5)
    train(net, opt, data, sched.step)
    tm.unfreeze("layer3", lr=1e-4)
    train(net, opt, data[:1], sched.step)
    tm.save(tmp_path / "r18.pt")
    model, fresh_opt, fresh_sched = build_resnet18(seed=1)
    torchmagic.resume(tmp_path / "r18.pt", model, fresh_opt, [fresh_sched])
    for m, o, s in ((net, opt, sched), (model, fresh_opt, fresh_sched)):
        train(m, o, data, s.step)
    assert_same(structure(net, opt), structure(model, fresh_opt))
    assert_same(state(net, opt), state(model, fresh_opt))
    assert [g["lr"] for g in fresh_opt.param_groups] == [g["lr"] for g in opt.param_groups]


def test_a_state_loaded_by_position_is_caught_by_the_doctor_resume_gets_it_right(saved):
    """The silent case of the issue: an optimizer rebuilt by hand with its groups' members
    in another order, and ``load_state_dict`` (by position) puts state on the wrong ones."""
    path, _, (model, opt, sched), _ = saved
    fresh, _, _ = build_net()
    fresh.fc = nn.Linear(8, 4)
    for p in [*fresh.stem.parameters()]:
        p.requires_grad_(False)
    layer1 = list(fresh.layer1.parameters())
    rest = [p for p in fresh.parameters() if p.requires_grad and all(p is not q for q in layer1)]
    by_hand = torch.optim.AdamW([{"params": rest[::-1]}, {"params": layer1, "lr": 3e-3}])
    by_hand.load_state_dict(opt.state_dict())  # no error: group sizes agree
    ns = {"model": fresh, "optimizer": by_hand}
    found = [
        f for f in torchmagic.Session(namespace=ns).doctor().findings if f.check == "state-shape"
    ]
    assert found and found[0].severity == "error"
    assert 'tm.load("PATH")' in found[0].fix and "torchmagic.resume" in found[0].fix
    model2, opt2, sched2 = build_net()
    right = torchmagic.resume(path, model2, opt2, [sched2])
    assert not [f for f in right.doctor().findings if f.check == "state-shape"]
    assert_same(state(model, opt), state(model2, opt2))


# -- refusals: one line, nothing changed ---------------------------------------------


def _refused(path, model, opt, scheds=()) -> str:
    before = snapshot(model, opt)
    sched_states = copy.deepcopy([s.state_dict() for s in scheds])
    with pytest.raises(TorchMagicError) as info:
        torchmagic.resume(path, model, opt, schedulers=scheds)
    assert_unchanged(before, snapshot(model, opt))
    assert [s.state_dict() for s in scheds] == sched_states
    message = str(info.value)
    assert "\n" not in message and message.startswith("cannot resume")
    return message


def test_refuses_another_architecture(saved):
    path, *_ = saved
    model, opt, sched = build_net(width=6)
    assert "another architecture: 'stem.0.weight' is [6, 3, 3, 3]" in _refused(
        path, model, opt, [sched]
    )
    torch.manual_seed(0)
    other = torchvision.models.resnet18(num_classes=4)
    other_opt = torch.optim.AdamW(other.parameters())
    assert "is a torchvision.models.resnet.ResNet" in _refused(path, other, other_opt)


def test_refuses_a_missing_head(saved):
    path, *_ = saved
    model, opt, sched = build_net(head="classifier")
    message = _refused(path, model, opt, [sched])
    assert "replaced the head at 'fc'" in message and "has no module 'fc'" in message


def test_refuses_another_optimizer_class(saved):
    path, *_ = saved
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    message = _refused(path, model, opt, [sched])
    assert (
        "the optimizer is a torch.optim.sgd.SGD, the file's is torch.optim.adamw.AdamW" in message
    )


def test_refuses_other_schedulers(saved):
    path, *_ = saved
    model, opt, _ = build_net()
    assert "the schedulers are [], the file's are [CosineAnnealingLR]" in _refused(path, model, opt)


def test_refuses_a_truncated_file(saved, tmp_path):
    path, *_ = saved
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    model, opt, sched = build_net()
    refused = _refused(cut, model, opt, [sched])
    assert refused.endswith(
        "it is not a readable torch file: damaged, truncated, or in another format"
    )


def test_refuses_a_file_that_is_not_ours(tmp_path):
    model, opt, sched = build_net()
    torch.save({"model": model.state_dict()}, tmp_path / "plain.pt")
    assert "not a torchmagic checkpoint" in _refused(tmp_path / "plain.pt", model, opt, [sched])
    torch.save(model, tmp_path / "pickled.pt")  # a pickled module: weights_only refuses it
    pickled = _refused(tmp_path / "pickled.pt", model, opt, [sched])
    assert f"the file holds Python objects or code ({Net.__module__}.Net)" in pickled
    (tmp_path / "notes.txt").write_text("hello")
    assert "not a readable torch file" in _refused(tmp_path / "notes.txt", model, opt, [sched])
    assert _refused(tmp_path / "missing.pt", model, opt, [sched]).endswith(": no such file")
    assert "it is a folder, not a file" in _refused(tmp_path, model, opt, [sched])
    assert "not a regular file (a device" in _refused("/dev/null", model, opt, [sched])


def test_refuses_a_model_the_session_already_changed(saved):
    path, *_ = saved
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    tm.freeze("stem")
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError, match="already changed 'model' \\(1 command"):
        tm.load(path)
    assert_unchanged(before, snapshot(model, opt))


def test_a_replay_that_ends_elsewhere_is_undone(saved):
    """The structure replays, but the model's own flags differ (frozen by hand): the
    replayed commands are undone and the refusal names the first difference."""
    path, *_ = saved
    model, opt, sched = build_net()
    model.layer2[0].weight.requires_grad_(False)
    message = _refused(path, model, opt, [sched])
    assert "'layer2.0.weight' is frozen, unlike in the file" in message


def test_resumed_commands_are_listed_but_not_undone(saved):
    path, *_ = saved
    model, opt, sched = build_net()
    tm = torchmagic.resume(path, model, opt, [sched])
    with pytest.raises(TorchMagicError, match="replayed from a checkpoint"):
        tm.undo()
    tm.freeze("layer2")  # a new command is undoable as ever
    tm.undo()
    assert all(p.requires_grad for p in model.layer2.parameters())


# -- the write -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "raised"),
    [
        (KeyboardInterrupt(), KeyboardInterrupt),  # Ctrl-C goes on as itself
        (OSError(28, "No space left on device"), TorchMagicError),  # Python's own writes
        (
            RuntimeError("[enforce fail at inline_container.cc] . file write failed"),
            TorchMagicError,
        ),
    ],
    ids=["ctrl-c", "full-disk", "torch-writer-failed"],
)
def test_a_failed_save_leaves_the_old_file(saved, monkeypatch, failure, raised):
    """Half the new file written, then Ctrl-C or a full disk: the old file is whole, no
    temporary file is left, and a refused write says why in one line."""
    path, _, _, tm = saved
    old = path.read_bytes()

    def half_then_fail(payload, where):
        with open(where, "wb") as stream:
            stream.write(b"PK\x03\x04 partial")
        raise failure

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(raised) as caught:
        tm.save(path)
    if raised is TorchMagicError:
        message = str(caught.value)
        assert "\n" not in message and message.endswith("the old file is kept")
        assert "No space left on device" in message or "MiB free on that disk" in message
    assert path.read_bytes() == old
    assert sorted(os.listdir(path.parent)) == [path.name]


@pytest.mark.parametrize("sync", [False, True])
def test_sync_puts_the_file_and_its_folder_on_disk(saved, monkeypatch, sync):
    """The default relies on the rename alone (Ctrl-C, a killed process, a full disk);
    ``sync=True`` fsyncs the whole file before the rename and the folder after it."""
    path, _, _, tm = saved
    synced: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def recording(handle: int) -> None:
        target = os.readlink(f"/proc/self/fd/{handle}")
        synced.append((os.path.basename(target), os.fstat(handle).st_size))
        real_fsync(handle)

    monkeypatch.setattr(os, "fsync", recording)
    report = tm.save(path, sync=sync)
    assert report.synced is sync
    if not sync:
        assert synced == []
        return
    (file_name, file_size), (folder_name, _) = synced
    assert file_name.startswith(".tm-save-") and file_size == path.stat().st_size
    assert folder_name == path.parent.name


def test_save_refuses_a_missing_folder(saved, tmp_path):
    *_, tm = saved
    with pytest.raises(TorchMagicError, match="no folder"):
        tm.save(tmp_path / "nope" / "x.pt")


def test_bn_frozen_exclude_and_sets_of_lrs_replay(tmp_path):
    """--bn frozen swaps modules, --except carves out, lr=A:B spreads, set_base_lrs."""
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    tm.freeze(exclude=["fc"], bn="frozen")
    train(model, opt, loader(), sched.step)
    tm.unfreeze("layer1-2", lr=(1e-4, 1e-3))
    tm.set_base_lrs({0: 5e-3})
    train(model, opt, loader(), sched.step)
    tm.save(tmp_path / "bn.pt")
    train(model, opt, loader(), sched.step)
    fresh, fresh_opt, fresh_sched = build_net(seed=3)
    torchmagic.resume(tmp_path / "bn.pt", fresh, fresh_opt, [fresh_sched])
    assert type(fresh.stem[1]).__name__ == "FrozenBatchNorm2d"
    train(fresh, fresh_opt, loader(), fresh_sched.step)
    assert_same(structure(model, opt), structure(fresh, fresh_opt))
    assert_same(state(model, opt), state(fresh, fresh_opt))


@pytest.mark.slow
def test_resume_in_a_fresh_process(saved, tmp_path):
    """The other process builds the model the original way and continues."""
    path, _, (model, opt, sched), _ = saved
    script = tmp_path / "resume.py"
    script.write_text(
        "import sys, torch, torchmagic\n"
        f"sys.path[:0] = {[str(Path(__file__).parent), str(TESTS)]!r}\n"
        "from test_checkpoint import build_net, loader\n"
        "from checkpoint_helpers import state, train\n"
        "model, opt, sched = build_net(seed=5)\n"
        f"torchmagic.resume({str(path)!r}, model, opt, [sched])\n"
        "train(model, opt, loader(), sched.step)\n"
        f"torch.save(state(model, opt), {str(tmp_path / 'after.pt')!r})\n"
    )
    src = str(Path(torchmagic.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    train(model, opt, loader(), sched.step)
    assert_same(state(model, opt), torch.load(tmp_path / "after.pt", weights_only=True))


def test_the_grad_scaler_state_goes_into_the_callers_scaler(tmp_path):
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    tm.amp.scaler = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=7)
    tm.save(tmp_path / "s.pt")
    fresh, fresh_opt, fresh_sched = build_net()
    mine = torch.amp.GradScaler("cpu")
    resumed = torchmagic.resume(tmp_path / "s.pt", fresh, fresh_opt, [fresh_sched], scaler=mine)
    assert resumed.amp.scaler is mine
    assert mine.get_scale() == 512.0 and mine.get_growth_interval() == 7


def test_a_save_replays_commands_undo_no_longer_keeps(saved, tmp_path):
    """Limits and clear cap the undo logs; the commands in effect stay in the file."""
    _, _, (model, opt, sched), tm = saved
    tm.clear_history()
    tm.freeze("layer2")
    tm.undo()  # undone: not in effect, not in the file
    tm.save(tmp_path / "after_clear.pt")
    commands = [
        c["command"] for c in torch.load(tmp_path / "after_clear.pt", weights_only=True)["history"]
    ]
    assert commands == [
        'tm.freeze("stem", "layer1")',
        'tm.replace_head("fc", 4)',
        'tm.unfreeze("layer1", lr=0.003)',
    ]
    fresh, fresh_opt, fresh_sched = build_net()
    torchmagic.resume(tmp_path / "after_clear.pt", fresh, fresh_opt, [fresh_sched])
    assert_same(structure(model, opt), structure(fresh, fresh_opt))


def test_a_new_session_after_the_one_that_made_the_commands_was_dropped_saves_them(tmp_path):
    """The commands outlive their session: a new Session on the same objects saves a file
    its own resume accepts, continuing exactly the state saved; the commands are listed
    there, and its undo refuses them in one line (their undo logs went with the session)."""
    model, opt, sched = build_net()
    first = torchmagic.Session(model, opt, schedulers=[sched])
    surgery(first, model, opt, sched)
    del first
    gc.collect()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    assert [spelled(e.command) for e in tm.history()] == [
        'tm.freeze("stem", "layer1")',
        'tm.replace_head("fc", 4)',
        'tm.unfreeze("layer1", lr=0.003)',
    ]
    assert all(e.stale == "made by a session since dropped" for e in tm.history())
    tm.save(tmp_path / "later.pt")
    at_save = structure(model, opt), state(model, opt), sched.state_dict()
    with pytest.raises(TorchMagicError, match="^cannot undo .*session that made it was dropped"):
        tm.undo()
    fresh, fresh_opt, fresh_sched = build_net(seed=7)
    resumed = torchmagic.resume(tmp_path / "later.pt", fresh, fresh_opt, [fresh_sched])
    assert_same(at_save[0], structure(fresh, fresh_opt))
    assert_same(at_save[1], state(fresh, fresh_opt))
    assert fresh_sched.state_dict() == at_save[2]
    assert len(resumed.history()) == 3
    tm.freeze("layer2")  # the new session's own command: after the adopted ones, undoable
    assert [e.index for e in tm.history()] == [1, 2, 3, 4]
    tm.undo()
    assert all(p.requires_grad for p in model.layer2.parameters())
