"""%tm save / %tm load in a shell: one Session call each, rendered; a bad file is one
UsageError line and changes nothing."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from checkpoint_helpers import assert_same, build_net, loader, state, structure, train
from snapshots import assert_same as assert_unchanged
from snapshots import snapshot


def _notebook(ip, path) -> tuple:
    model, opt, sched = build_net()
    ip.user_ns.update(model=model, optimizer=opt, scheduler=sched)
    ip.run_line_magic("freeze", "model.stem model.layer1")
    ip.run_line_magic("replace_head", "fc 4")
    train(model, opt, loader(), sched.step)
    ip.run_line_magic("unfreeze", "layer1 lr=3e-3")
    with capture_output() as cap:
        ip.run_line_magic("tm", f"save {path}")
    return (model, opt, sched), cap


def test_save_then_load_in_a_fresh_shell(ip, tmp_path):
    path = tmp_path / "nb.pt"
    (model, opt, sched), cap = _notebook(ip, path)
    shown = cap.outputs[0].data
    assert "text/html" in shown and "saved `model` (Net)" in shown["text/plain"]
    assert "%unfreeze layer1 lr=3e-3" in shown["text/plain"]
    fresh, fresh_opt, fresh_sched = build_net(seed=9)
    ip.user_ns.clear()
    ip.user_ns.update(model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    ip.run_line_magic("tm", "clear")
    with capture_output() as cap:
        ip.run_line_magic("tm", f"load {path}")
    assert "resumed `model` (Net)" in cap.outputs[0].data["text/plain"]
    assert_same(structure(model, opt), structure(fresh, fresh_opt))
    assert_same(state(model, opt), state(fresh, fresh_opt))
    with capture_output() as cap:
        ip.run_line_magic("tm", "history")
    listed = cap.outputs[0].data["text/plain"]
    assert "%replace_head fc 4" in listed and "replayed from a checkpoint" in listed
    assert "stale" not in listed


def test_load_of_a_bad_file_is_one_usage_error(ip, tmp_path):
    model, opt, sched = build_net()
    ip.user_ns.update(model=model, optimizer=opt, scheduler=sched)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    before = snapshot(model, opt)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("tm", f"load {tmp_path / 'junk.pt'}")
    assert "\n" not in str(info.value) and "not a readable torch file" in str(info.value)
    assert_unchanged(before, snapshot(model, opt))
    with pytest.raises(UsageError):
        ip.run_line_magic("tm", "save")  # PATH is required


def test_save_sync_flag_reaches_the_session(ip, tmp_path, monkeypatch):
    import os

    model, opt, sched = build_net()
    ip.user_ns.update(model=model, optimizer=opt, scheduler=sched)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with capture_output() as cap:
        ip.run_line_magic("tm", f"save {tmp_path / 'a.pt'}")
    assert synced == [] and "synced" not in cap.outputs[0].data["text/plain"]
    with capture_output() as cap:
        ip.run_line_magic("tm", f"save {tmp_path / 'b.pt'} --sync")
    assert len(synced) == 2 and "synced to disk" in cap.outputs[0].data["text/plain"]
