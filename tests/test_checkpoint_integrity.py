"""A damaged checkpoint is refused by name before anything changes: a flipped bit in the
file's bytes, a tensor edited to NaN, an optimizer state of the wrong shape."""

from __future__ import annotations

import pytest
import torch

import torchmagic
from snapshots import assert_same, snapshot
from test_checkpoint import build_net, surgery
from torchmagic import TorchMagicError


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
    covered = set(payload["digests"])
    assert set(payload["model"]["state_dict"]) <= covered
    assert "the optimizer's exp_avg_sq of 'fc.weight'" in covered
    fresh, opt, sched = build_net()
    torchmagic.resume(path, fresh, opt, [sched])
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
