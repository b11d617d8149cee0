"""A damaged checkpoint is refused by name before anything changes: a flipped bit in the
file's bytes, a tensor edited to NaN, an optimizer state of the wrong shape."""

from __future__ import annotations

import copy

import pytest
import torch

import torchmagic
from snapshots import assert_same, snapshot
from test_checkpoint import build_net, surgery
from torchmagic import TorchMagicError
from torchmagic.core.checkpoint import integrity


@pytest.fixture
def saved(tmp_path):
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    surgery(tm, model, opt, sched)
    path = tmp_path / "run.pt"
    tm.save(path)
    return path, model


def _refused(path) -> str:
    model, opt, sched = build_net()
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError) as info:
        torchmagic.resume(path, model, opt, [sched])
    assert_same(before, snapshot(model, opt))
    message = str(info.value)
    assert "\n" not in message and message.endswith("nothing was changed")
    return message


def _edited(path, edit) -> None:
    payload = torch.load(path, weights_only=True)
    edit(payload)
    torch.save(payload, path)


def test_a_flipped_exponent_bit_in_the_file_is_refused_by_name(saved):
    path, model = saved
    weight = model.layer2[0].weight.detach().contiguous().numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(weight)
    assert at >= 0 and data.find(weight, at + 1) < 0  # the record's bytes, stored as is
    data[at + 3] ^= 0x40  # the top exponent bit of the first float (little-endian)
    path.write_bytes(bytes(data))
    flipped = torch.load(path, weights_only=True)["model"]["state_dict"]["layer2.0.weight"]
    assert flipped.abs().max() > 1e30  # torch itself loads it silently
    message = _refused(path)
    assert "layer2.0.weight was damaged after the save: its digest differs" in message


def test_a_tensor_edited_to_nan_is_refused(saved):
    path, _ = saved

    def to_nan(payload):
        payload["model"]["state_dict"]["fc.bias"][1] = float("nan")

    _edited(path, to_nan)
    assert "fc.bias was damaged after the save: its digest differs (it now holds NaN or inf)" in (
        _refused(path)
    )


def _wrong_exp_avg(payload):
    state = payload["optimizer"]["state"]["layer1.0.weight"]
    state["exp_avg"] = torch.zeros(3, 2)


def test_an_exp_avg_of_the_wrong_shape_is_refused_by_its_digest(saved):
    path, _ = saved
    _edited(path, _wrong_exp_avg)
    message = _refused(path)
    assert "the optimizer's exp_avg of 'layer1.0.weight' is [3, 2] torch.float32 in the file" in (
        message
    )


def test_an_exp_avg_of_the_wrong_shape_is_refused_without_digests(saved):
    """A file without digests (written before them, or by another tool): the shapes of the
    states are still checked against their parameters, after the replay, which is undone."""
    path, _ = saved

    def edit(payload):
        _wrong_exp_avg(payload)
        del payload["digests"]

    _edited(path, edit)
    assert "the optimizer's exp_avg of 'layer1.0.weight' is [3, 2], its parameter [8, 8, 3, 3]" in (
        _refused(path)
    )


def test_an_undamaged_file_resumes_and_digests_cover_every_tensor(saved):
    path, model = saved
    payload = torch.load(path, weights_only=True)
    digests, word_bytes, _ = integrity.saved_digests(payload)
    assert word_bytes == 8
    covered = set(digests)
    assert set(payload["model"]["state_dict"]) <= covered
    assert "the optimizer's exp_avg_sq of 'fc.weight'" in covered
    fresh, opt, sched = build_net()
    torchmagic.resume(path, fresh, opt, [sched])
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


# -- all or nothing ----------------------------------------------------------------------


def _after(module, name: str, calls: int = 1):
    """``module.name`` that runs as ever, then raises KeyboardInterrupt at its ``calls``-th
    call (after its work: the worst moment, half of the load done)."""
    original = getattr(module, name)
    count = [0]

    def interrupted(*args, **kwargs):
        result = original(*args, **kwargs)
        count[0] += 1
        if count[0] == calls:
            raise KeyboardInterrupt
        return result

    return original, interrupted


def _points():
    import torchmagic.core.checkpoint as checkpoint_file
    import torchmagic.core.checkpoint.restore as restore
    import torchmagic.core.session.save_load as session_checkpoint
    from torchmagic.core import sharding

    return [
        (session_checkpoint, "_replay_call", 1),
        (session_checkpoint, "_replay_call", 3),
        (checkpoint_file, "check_replayed", 1),
        (torch.nn.Module, "load_state_dict", 1),
        (restore, "_placed", 5),
        (checkpoint_file, "load_states", 1),
        (torch.optim.lr_scheduler.LRScheduler, "load_state_dict", 1),
        (checkpoint_file, "load_precision", 1),
        (restore, "restore_rng", 1),
        (checkpoint_file, "load_rng", 1),
        (sharding, "guard_unsharded_steps", 1),
    ]


@pytest.mark.parametrize("point", range(11))
def test_an_interrupted_resume_leaves_the_state_before_and_a_retry_works(saved, monkeypatch, point):
    path, trained = saved
    module, name, calls = _points()[point]
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    before = snapshot(model, opt)
    sched_before, rng_before = copy.deepcopy(sched.state_dict()), torch.get_rng_state()
    with pytest.raises(TorchMagicError, match="nothing to undo") as nothing:
        tm.undo()
    original, interrupted = _after(module, name, calls)
    monkeypatch.setattr(module, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        tm.load(path)
    monkeypatch.setattr(module, name, original)
    assert_same(before, snapshot(model, opt))
    assert sched.state_dict() == sched_before and torch.equal(torch.get_rng_state(), rng_before)
    assert tm.history() == () and not tm.amp.enabled
    with pytest.raises(TorchMagicError) as again:
        tm.undo()
    assert str(again.value) == str(nothing.value)
    tm.load(path)  # the retry
    for (key, a), b in zip(trained.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
    assert len(tm.history()) == 3


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(1001),  # 4004 bytes: summed as int32 words, also in 64-bit sums
        torch.randn(7, 3, dtype=torch.float64),
        torch.randn(33, dtype=torch.bfloat16),  # 66 bytes: summed as bytes
        torch.arange(5, dtype=torch.uint8),  # 5 bytes: summed as bytes
        torch.randn(4, 6)[:, ::2],  # not contiguous
        torch.randn(9)[1:],  # a view whose words do not start at its storage's
        torch.full((4,), 2**62, dtype=torch.int64),  # the 64-bit sum wraps
    ],
    ids=["float32", "float64", "bf16", "odd bytes", "strided", "offset", "wraps"],
)
@pytest.mark.parametrize("word_bytes", [8, 4])
def test_the_digest_is_the_word_sum_torch_gives(tensor, word_bytes):
    """The CPU digest (summed by numpy) is the number torch's own sum gives in an int64
    (wrapping), which a digest on another device computes; 4-byte words are what files
    written before carry."""
    flat = tensor.contiguous().reshape(-1).clone().view(torch.uint8)
    for size, words in ((8, torch.int64), (4, torch.int32)):
        if size <= word_bytes and flat.numel() % size == 0:
            flat = flat.view(words)
            break
    assert integrity.digest(tensor, word_bytes) == int(flat.sum(dtype=torch.int64))


def _with_32_bit_digests(payload):
    """The payload as a save before the 64-bit sums wrote it: a dict of 32-bit sums."""
    del payload["digests"]
    integrity.write_digests(payload)
    digests, _, _ = integrity.saved_digests(payload)
    for name, tensor in integrity._tensors(payload):
        digests[name][2] = integrity.digest(tensor, 4)
    payload["digests"] = digests


def test_a_file_with_the_32_bit_digests_of_before_is_verified(saved):
    path, model = saved
    _edited(path, _with_32_bit_digests)
    fresh, opt, sched = build_net()
    torchmagic.resume(path, fresh, opt, [sched])
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name

    def flip(payload):
        payload["model"]["state_dict"]["fc.weight"].view(torch.int32)[0] ^= 1

    _edited(path, flip)
    assert "fc.weight was damaged after the save: its digest differs" in _refused(path)


def test_unreadable_digests_are_refused(saved):
    path, _ = saved

    def garble(payload):
        payload["digests"] = "{not json"

    _edited(path, garble)
    assert "its digests are not readable by this torchmagic" in _refused(path)
