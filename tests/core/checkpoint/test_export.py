"""Session.export / %tm export: the commands as a script of Session calls that, run with
the variables its header names, makes the same structure (flags, groups, lrs, heads)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from torch.utils.data import DataLoader, TensorDataset

import torchmagic
from checkpoint_helpers import assert_same, batches, structure
from paths import ROOT, TESTS
from test_checkpoint import build_net
from torchmagic.core.advice import spelled
from torchmagic.core.errors import TorchMagicError
from torchmagic.core.export import script as export_script

HERE = Path(__file__).resolve().parent


def filled(text: str, constructors: str) -> str:
    """The exported skeleton with ``constructors`` in its marked place (what a user does)."""
    head, rest = text.split(f"# {export_script.BUILD_START}\n")
    _, tail = rest.split(f"# {export_script.BUILD_END}\n")
    return head + constructors + tail


def _loader() -> DataLoader:
    data = batches(1, (8, 3, 8, 8), 4, seed=2)[0]
    return DataLoader(TensorDataset(*data), batch_size=4)


def _notebook_session(ns: dict) -> torchmagic.Session:
    tm = torchmagic.Session(namespace=ns)
    tm.freeze("net.stem", "net.layer1", bn="frozen")
    tm.replace_head("fc", 4, dropout=0.1)
    tm.fit("train_loader", epochs=1)
    tm.unfreeze("layer1", lr=(3e-4, 3e-3))
    tm.set_base_lrs({0: 0.02})
    return tm


def test_the_script_rebuilds_the_same_structure(tmp_path):
    net, opt, sched = build_net()
    ns = {"net": net, "opt": opt, "sched": sched, "train_loader": _loader()}
    tm = _notebook_session(ns)
    report = tm.export(tmp_path / "run.py")
    text = (tmp_path / "run.py").read_text()
    assert [n for n, _ in report.variables] == ["net", "opt", "sched", "train_loader"]
    assert "tm = torchmagic.Session(net, opt, schedulers=[sched])" in text
    assert "tm.freeze('stem', 'layer1', bn='frozen')" in text
    assert "tm.fit(train_loader, epochs=1)" in text
    assert "tm.set_base_lrs({0: 0.02})" in text
    assert report.commands == 5
    fresh, fresh_opt, fresh_sched = build_net(seed=4)
    scope = {"net": fresh, "opt": fresh_opt, "sched": fresh_sched, "loader": _loader()}
    build = "net, opt, sched, train_loader = net, opt, sched, loader\n"
    exec(compile(filled(text, build), "run.py", "exec"), scope)  # noqa: S102  # ours
    mine, theirs = structure(net, opt), structure(fresh, fresh_opt)
    assert_same(mine, theirs)
    assert fresh_sched.base_lrs == sched.base_lrs
    assert [spelled(e.command) for e in scope["tm"].history()] == [
        'tm.freeze("stem", "layer1", bn="frozen")',
        'tm.replace_head("fc", 4, dropout=0.1)',
        'tm.unfreeze("layer1", lr=(3e-4, 0.003))',
        "tm.set_base_lrs(lrs={0: 0.02})",
    ]


def test_a_progressive_fit_is_exported_once(tmp_path):
    """Unfreezes a fit made itself are the fit's: the script runs the fit, not them too."""
    net, opt, sched = build_net()
    ns = {"model": net, "optimizer": opt, "train_loader": _loader(), "val_loader": _loader()}
    tm = torchmagic.Session(namespace=ns)
    tm.freeze(exclude=["fc"])
    tm.fit("train_loader", val="val_loader", epochs=2, unfreeze="layer2", every=1)
    assert any(e.action == "unfreeze" for e in tm.history())
    tm.export(tmp_path / "p.py")
    calls = [
        line for line in (tmp_path / "p.py").read_text().splitlines() if line.startswith("tm.")
    ]
    assert calls == [
        "tm.freeze(bn='eval', exclude=['fc'])  # tm.freeze(exclude=(\"fc\",))",
        "tm.fit(train_loader, val=val_loader, epochs=2, unfreeze=('layer2',), every=1)",
    ]


def test_export_magic_writes_and_refuses_other_names(ip, tmp_path):
    net, opt, _ = build_net()
    ip.user_ns.update(model=net, optimizer=opt)
    ip.run_line_magic("freeze", "model.stem")
    ip.run_line_magic("tm", f"export {tmp_path / 'x.py'}")
    text = (tmp_path / "x.py").read_text()
    assert "tm.freeze('stem', bn='eval')  # %freeze model.stem" in text
    with pytest.raises(UsageError, match=r"must end in one of .py, .pt2, .safetensors, .onnx"):
        ip.run_line_magic("tm", f"export {tmp_path / 'x.txt'}")
    assert not (tmp_path / "x.txt").exists()
    assert not net.stem[0].weight.requires_grad


# -- every command kind, replayed in a fresh process ---------------------------------------

_BUILD = """\
import sys
sys.path[:0] = {paths!r}
from test_checkpoint import build_net
from test_export import _loader
net, opt, sched = build_net(seed=4)
train_loader, val_loader = _loader(), _loader()
"""

_REPORT = """
from checkpoint_helpers import structure
import json
done = structure(net, opt)
done["amp"] = repr(tm.amp_status().dtype)
done["history"] = [e.action for e in tm.history()]
json.dump(done, open({out!r}, "w"), default=repr)
"""


def _every_command(tm: torchmagic.Session) -> None:
    tm.replace_head("fc", 4)
    tm.fine_tune("train_loader", val="val_loader", epochs=1)
    tm.amp_on("bf16")
    tm.fit("train_loader", max_steps=1, accumulate=2, clip=1.0)
    tm.amp_off()
    tm.lr_find("train_loader", steps=4, apply=True)
    tm.lora("layer1.0", r=2, alpha=4.0)
    tm.merge_lora()
    tm.lora("stem.0", "layer2.0", r=4, alpha=8.0, dropout=0.1, lr=1e-3)
    tm.lora_off()
    tm.lora_on()
    tm.freeze("stem", bn="frozen")
    tm.unfreeze("layer2", lr=(1e-4, 2e-4))
    tm.set_base_lrs({0: 0.02})
    tm.amp_on("bf16")


def test_every_command_replays_in_a_fresh_process(tmp_path):
    net, opt, sched = build_net(seed=4)
    ns = {"net": net, "opt": opt, "sched": sched}
    ns.update(train_loader=_loader(), val_loader=_loader())
    tm = torchmagic.Session(namespace=ns)
    _every_command(tm)
    tm.export(tmp_path / "job.py")
    text = (tmp_path / "job.py").read_text()
    assert "tm.lora('stem.0', 'layer2.0', r=4, alpha=8.0, dropout=0.1, lr=0.001)" in text
    assert "tm.amp_on('bf16')" in text and "tm.amp_off()" in text
    assert "tm.fine_tune(train_loader, val=val_loader, epochs=1)" in text
    assert "torchrun --nproc_per_node=2" in text
    out = tmp_path / "done.json"
    job = tmp_path / "filled.py"
    paths = [str(HERE), str(TESTS)]
    job.write_text(filled(text, _BUILD.format(paths=paths)) + _REPORT.format(out=str(out)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *paths])}
    run = subprocess.run(
        [sys.executable, str(job)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(out.read_text())
    mine = json.loads(json.dumps(structure(net, opt), default=repr))
    assert {k: theirs[k] for k in mine} == mine
    assert tm.amp.enabled and tm.amp.dtype == torch.bfloat16
    assert theirs["amp"] == repr(tm.amp_status().dtype)
    assert theirs["history"] == [e.action for e in tm.history()]


def test_a_loss_of_the_users_is_asked_for_in_the_marked_place(tmp_path):
    net, opt, sched = build_net(seed=4)
    ns = {"net": net, "opt": opt, "sched": sched, "train_loader": _loader()}
    ns["criterion"] = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    tm = torchmagic.Session(namespace=ns)
    tm.freeze("net.stem")
    tm.fit("train_loader", epochs=1, loss="criterion")
    tm.export(tmp_path / "job.py")
    text = (tmp_path / "job.py").read_text()
    assert "criterion    = ...  # the loss function tm.fit used" in text
    assert "tm.fit(train_loader, epochs=1, loss=criterion)" in text
    paths = [str(HERE), str(TESTS)]
    build = _BUILD.format(paths=paths) + "criterion = torch.nn.CrossEntropyLoss()\n"
    job = tmp_path / "filled.py"
    job.write_text(filled(text, build))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *paths])}
    run = subprocess.run(
        [sys.executable, str(job)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_unfilled_skeleton_says_so(tmp_path):
    net, opt, _ = build_net()
    tm = torchmagic.Session(net, opt)
    tm.freeze("stem")
    tm.export(tmp_path / "job.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [sys.executable, str(tmp_path / "job.py")], env=env, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert run.stderr.strip() == "build the model, optimizer and data in the marked place first"


# -- writing: atomic, never over a file unless forced, one line per failure --------------


def _session() -> torchmagic.Session:
    net, opt, _ = build_net()
    tm = torchmagic.Session(net, opt)
    tm.freeze("stem")
    return tm


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tm-export"))


def test_an_existing_file_is_kept_unless_forced(tmp_path):
    tm, path = _session(), tmp_path / "run.py"
    path.write_text("mine\n")
    with pytest.raises(TorchMagicError, match="the file exists; force=True replaces it") as err:
        tm.export(path)
    assert "\n" not in str(err.value)
    assert path.read_text() == "mine\n"
    tm.export(path, force=True)
    assert "tm.freeze('stem'" in path.read_text()
    assert _leftovers(tmp_path) == []


def test_the_mode_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        _session().export(tmp_path / "run.py")
    finally:
        os.umask(old)
    assert (tmp_path / "run.py").stat().st_mode & 0o777 == 0o640


def test_a_folder_is_refused_in_one_line(tmp_path):
    (tmp_path / "x.py").mkdir()
    with pytest.raises(TorchMagicError, match=r"x\.py': it is a folder$"):
        _session().export(tmp_path / "x.py", force=True)
    with pytest.raises(TorchMagicError, match=r"must end in one of .py, .pt2, .*\.onnx$"):
        _session().export(tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(TorchMagicError, match="Permission denied; nothing was written") as e:
            _session().export(folder / "run.py")
        assert "\n" not in str(e.value)
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_a_full_disk_leaves_no_file(tmp_path, monkeypatch):
    real_replace = os.replace

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(TorchMagicError, match="No space left on device; nothing was written"):
        _session().export(tmp_path / "run.py")
    monkeypatch.setattr(os, "replace", real_replace)
    assert list(tmp_path.iterdir()) == []


def test_force_in_the_magic(ip, tmp_path):
    net, opt, _ = build_net()
    ip.user_ns.update(model=net, optimizer=opt)
    ip.run_line_magic("freeze", "model.stem")
    path = tmp_path / "x.py"
    path.write_text("mine\n")
    with pytest.raises(UsageError, match="the file exists; --force replaces it"):
        ip.run_line_magic("tm", f"export {path}")
    assert path.read_text() == "mine\n"
    ip.run_line_magic("tm", f"export {path} --force")
    assert "tm.freeze('stem', bn='eval')" in path.read_text()
