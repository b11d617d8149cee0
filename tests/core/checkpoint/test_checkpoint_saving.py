"""Session.save on a real file system: a full disk is one line with no temporary file
left, Ctrl-C right after the temporary file exists leaves none, the file's mode is what
``torch.save`` gives (the umask's, or the old file's), and a symlink's target is written."""

from __future__ import annotations

import errno
import os
import stat

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic import TorchMagicError
from torchmagic.core.checkpoint import files


def _built(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _session() -> torchmagic.Session:
    model, opt = _built()
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return torchmagic.Session(model, opt)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test: a process started in the background by a
    non-interactive shell (nohup, ``&``, some CI runners) inherits SIGINT ignored, and a
    real SIGINT would then never reach the code under test."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def umask():
    """Set the process's umask for one test, and put it back."""
    kept = os.umask(0o022)
    os.umask(kept)

    def set_to(value: int) -> None:
        os.umask(value)

    yield set_to
    os.umask(kept)


REAL_SAVE = torch.save


def _no_space(payload, where):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _real_full_disk(payload, where):
    """torch's own C++ writer on a device that is always full: its real error text."""
    REAL_SAVE(payload, "/dev/full")


@pytest.mark.parametrize(
    "writer", [_no_space, _real_full_disk], ids=["ENOSPC", "torch-writer-on-dev-full"]
)
def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch, writer):
    if writer is _real_full_disk and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    tm = _session()
    monkeypatch.setattr(torch, "save", writer)
    with pytest.raises(TorchMagicError) as caught:
        tm.save(tmp_path / "run.pt")
    message = str(caught.value)
    assert "\n" not in message and "inline_container" not in message
    assert message.startswith(f"cannot save to '{tmp_path / 'run.pt'}': ")
    assert message.endswith("; nothing was written")
    assert os.listdir(tmp_path) == []


def test_ctrl_c_right_after_the_temporary_file_is_made_leaves_none(tmp_path, monkeypatch):
    """The interrupt lands while the new file's mode is set (the first thing after
    ``mkstemp``): it goes on as itself, and the file is gone."""
    tm = _session()
    real_fchmod = os.fchmod

    def interrupted(fd: int, mode: int) -> None:
        real_fchmod(fd, mode)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fchmod", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tm.save(tmp_path / "run.pt")
    assert os.listdir(tmp_path) == []


def test_a_sigint_while_the_temporary_file_is_made_comes_after_it_is_named(
    tmp_path, monkeypatch, python_sigint
):
    """A real SIGINT sent inside ``mkstemp``, after the file exists: held until the name is
    known, then delivered, and the file removed."""
    import signal
    import tempfile

    tm = _session()
    real_mkstemp = tempfile.mkstemp

    def signalled(*args, **kwargs):
        made = real_mkstemp(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return made

    monkeypatch.setattr(files.tempfile, "mkstemp", signalled)
    with pytest.raises(KeyboardInterrupt):
        tm.save(tmp_path / "run.pt")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_a_new_file_honours_the_umask_as_torch_save_does(tmp_path, umask, mask):
    tm = _session()
    umask(mask)
    tm.save(tmp_path / "run.pt")
    torch.save({"x": torch.zeros(1)}, tmp_path / "by_hand.pt")
    assert _mode(tmp_path / "run.pt") == _mode(tmp_path / "by_hand.pt") == 0o666 & ~mask


def test_saving_over_a_file_keeps_its_mode_as_torch_save_does(tmp_path, umask):
    tm = _session()
    umask(0o022)
    for name in ("run.pt", "by_hand.pt"):
        (tmp_path / name).write_bytes(b"old")
        os.chmod(tmp_path / name, 0o640)
    tm.save(tmp_path / "run.pt")
    torch.save({"x": torch.zeros(1)}, tmp_path / "by_hand.pt")
    assert _mode(tmp_path / "run.pt") == _mode(tmp_path / "by_hand.pt") == 0o640


def test_saving_over_a_symlink_writes_its_target(tmp_path):
    """The link stays a link; the file it points to (in another folder) is the new one,
    and no temporary file is left beside either."""
    tm = _session()
    (tmp_path / "store").mkdir()
    (tmp_path / "runs").mkdir()
    target = tmp_path / "store" / "run-1.pt"
    target.write_bytes(b"old")
    link = tmp_path / "runs" / "latest.pt"
    link.symlink_to(target)
    report = tm.save(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert report.path == str(link) and report.nbytes == target.stat().st_size
    assert torch.load(target, weights_only=True)["format"] == "torchmagic.checkpoint"
    assert sorted(os.listdir(tmp_path / "store")) == ["run-1.pt"]
    assert sorted(os.listdir(tmp_path / "runs")) == ["latest.pt"]
    fresh, fresh_opt = _built(seed=5)
    torchmagic.resume(link, fresh, fresh_opt)
    saved_weights = tm.bound().model.state_dict()
    assert all(torch.equal(v, saved_weights[k]) for k, v in fresh.state_dict().items())


def test_a_dangling_symlink_writes_the_file_it_names(tmp_path):
    tm = _session()
    target = tmp_path / "new.pt"
    link = tmp_path / "link.pt"
    link.symlink_to(target)
    tm.save(link)
    assert link.is_symlink() and target.is_file()


def test_a_folder_is_refused_in_one_line(tmp_path):
    tm = _session()
    (tmp_path / "x.pt").mkdir()
    with pytest.raises(TorchMagicError, match=r"^cannot save to '.*x\.pt': it is a folder$"):
        tm.save(tmp_path / "x.pt")
    assert os.listdir(tmp_path / "x.pt") == []


def test_a_read_only_folder_is_refused_in_one_line(tmp_path, monkeypatch):
    """The temporary file cannot be made (EACCES, as ``mkstemp`` raises it in a folder
    without write permission; the suite may run as root, whom chmod does not stop)."""
    tm = _session()

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(files.tempfile, "mkstemp", refused)
    with pytest.raises(TorchMagicError) as caught:
        tm.save(tmp_path / "run.pt")
    assert str(caught.value) == (
        f"cannot save to '{tmp_path / 'run.pt'}': Permission denied; nothing was written"
    )
    assert os.listdir(tmp_path) == []


def test_a_sigint_while_the_umask_is_read_leaves_the_umask(
    tmp_path, monkeypatch, umask, python_sigint
):
    """Python reads the umask only by setting one and putting the old back: a real SIGINT
    between the two is held, so the process keeps its own umask and no file is left."""
    import signal

    tm = _session()
    umask(0o027)
    real_umask = os.umask

    def signalled(value: int) -> int:
        old = real_umask(value)
        if value != 0o027:  # the probe, not the putting back
            os.kill(os.getpid(), signal.SIGINT)
        return old

    monkeypatch.setattr(files.os, "umask", signalled)
    with pytest.raises(KeyboardInterrupt):
        tm.save(tmp_path / "run.pt")
    monkeypatch.undo()
    assert os.umask(0o027) == 0o027
    assert os.listdir(tmp_path) == []
