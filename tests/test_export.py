"""Session.export / %tm export: the commands as a script of Session calls that, run with
the variables its header names, makes the same structure (flags, groups, lrs, heads)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from torch.utils.data import DataLoader, TensorDataset

import torchmagic
from checkpoint_helpers import assert_same, batches, structure
from test_checkpoint import build_net
from torchmagic.core.advice import spelled


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
    scope = {"net": fresh, "opt": fresh_opt, "sched": fresh_sched, "train_loader": _loader()}
    exec(compile(text, "run.py", "exec"), scope)  # noqa: S102  # the script we wrote
    mine, theirs = structure(net, opt), structure(fresh, fresh_opt)
    assert_same(mine, theirs)
    assert fresh_sched.base_lrs == sched.base_lrs
    assert [spelled(e.command) for e in scope["tm"].history()] == [
        'tm.freeze("stem", "layer1", bn="frozen")',
        'tm.replace_head("fc", 4, dropout=0.1)',
        'tm.unfreeze("layer1", lr=(0.0003, 0.003))',
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
    with pytest.raises(UsageError, match="must end in .py"):
        ip.run_line_magic("tm", f"export {tmp_path / 'x.txt'}")
    assert not (tmp_path / "x.txt").exists()
    assert not net.stem[0].weight.requires_grad
