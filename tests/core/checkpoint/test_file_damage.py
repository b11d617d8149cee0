"""Every byte of a saved file is verified before any of it is used: a flipped bit anywhere
(the pickled structure, a tensor, the zip records), or an edit of any value (a group's
max_lr, a scheduler's key, an RNG state, a parameter's name, a command), is refused in one
line naming where, with nothing changed; or the file loads to exactly the saved state."""

from __future__ import annotations

import io
import json
import random
import struct
import zipfile

import pytest
import torch

import torchmagic
from snapshots import assert_same, equal, snapshot
from test_checkpoint import build_net, surgery
from torchmagic import TorchMagicError
from torchmagic.core.checkpoint import integrity


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small session's file, and the state a resume of it gives."""
    model, opt, sched = build_net()
    tm = torchmagic.Session(model, opt, schedulers=[sched])
    surgery(tm, model, opt, sched)
    path = tmp_path_factory.mktemp("damage") / "run.pt"
    tm.save(path)
    return path.read_bytes(), _resumed(path)


def _state(model, opt, sched) -> dict:
    return {
        "model": model.state_dict(),
        "flags": [p.requires_grad for p in model.parameters()],
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": torch.get_rng_state(),
        "random": random.getstate(),
    }


def _resumed(path) -> dict:
    model, opt, sched = build_net()
    torchmagic.resume(path, model, opt, [sched])
    return _state(model, opt, sched)


def _outcome(path) -> str | None:
    """The one-line refusal of ``path`` (after checking that nothing changed), or None
    when it resumed."""
    model, opt, sched = build_net()
    before = snapshot(model, opt), sched.state_dict(), torch.get_rng_state()
    try:
        torchmagic.resume(path, model, opt, [sched])
    except TorchMagicError as exc:
        assert_same(before[0], snapshot(model, opt))
        assert equal(before[1], sched.state_dict()) and torch.equal(
            before[2], torch.get_rng_state()
        )
        message = str(exc)
        assert "\n" not in message and message.startswith("cannot resume from"), message
        return message
    return None


def _flip_positions(size: int, count: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(size), min(count, size)))


def _check_flips(tmp_path, saved, positions) -> tuple[int, int]:
    data, expected = saved
    path = tmp_path / "flipped.pt"
    refused = loaded = 0
    for at in positions:
        damaged = bytearray(data)
        damaged[at] ^= 1 << (at % 8)
        path.write_bytes(bytes(damaged))
        # RNG states are part of what a resume sets: start each try from the same ones
        torch.manual_seed(0)
        random.seed(0)
        message = _outcome(path)
        if message is None:
            loaded += 1
            got = _state(*_rebuilt_from(path))
            for key in expected:
                assert equal(expected[key], got[key]), f"byte {at}: {key} loaded differently"
        else:
            refused += 1
    return refused, loaded


def _rebuilt_from(path):
    model, opt, sched = build_net()
    torchmagic.resume(path, model, opt, [sched])
    return model, opt, sched


def test_a_bit_flipped_anywhere_is_refused_or_changes_nothing(tmp_path, saved):
    data, _ = saved
    refused, loaded = _check_flips(tmp_path, saved, _flip_positions(len(data), 120, seed=1))
    assert refused > 90  # nearly every byte matters; the rest is zip padding and the like


@pytest.mark.slow
def test_a_bit_flipped_at_2000_positions_is_refused_or_changes_nothing(tmp_path, saved):
    data, _ = saved
    _check_flips(tmp_path, saved, _flip_positions(len(data), 2000, seed=2))


def _pickle_range(data: bytes) -> range:
    """Where data.pkl's bytes lie in the file (stored, not compressed)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    at = info.header_offset
    name_length, extra_length = struct.unpack("<HH", data[at + 26 : at + 30])
    start = at + 30 + name_length + extra_length
    return range(start, start + info.file_size)


def test_every_byte_of_the_pickled_structure_is_refused(tmp_path, saved):
    """The pickled part (hyper-parameters, scheduler and RNG states, names, the history,
    the digests): a bit flipped anywhere in it is refused before it is unpickled."""
    data, _ = saved
    where = _pickle_range(data)
    positions = sorted(random.Random(3).sample(where, 60))
    refused, loaded = _check_flips(tmp_path, saved, positions)
    assert (refused, loaded) == (60, 0)


def _edited(tmp_path, saved, edit) -> str:
    data, _ = saved
    path = tmp_path / "edited.pt"
    path.write_bytes(data)
    payload = torch.load(path, weights_only=True)
    edit(payload)
    torch.save(payload, path)  # a valid zip with valid CRCs: only the digests can tell
    message = _outcome(path)
    assert message is not None, "an edited file was accepted"
    return message


def test_a_changed_max_lr_is_refused(tmp_path, saved):
    def edit(payload):
        group = payload["optimizer"]["groups"][-1]["hyperparameters"]
        group["lr"] = group["lr"] / 4

    assert "the optimizer's param groups, hyper-parameters or state differ" in _edited(
        tmp_path, saved, edit
    )


def test_a_damaged_scheduler_key_is_refused(tmp_path, saved):
    def edit(payload):
        state = payload["schedulers"][0]["state"]
        state["last_epocj"] = state.pop("last_epoch")

    assert "the scheduler states differ" in _edited(tmp_path, saved, edit)


def test_a_damaged_rng_state_is_refused(tmp_path, saved):
    def edit(payload):
        rng = payload["rng"]
        tensor = next(v for v in _leaves(rng) if isinstance(v, torch.Tensor))
        tensor[5] ^= 1

    assert "the RNG states differ" in _edited(tmp_path, saved, edit)


def _leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def test_a_damaged_parameter_name_and_command_key_are_refused(tmp_path, saved):
    def rename(payload):
        params = payload["optimizer"]["groups"][0]["params"]
        params[0] = params[0].replace("weight", "weighs")

    assert "the optimizer's param groups" in _edited(tmp_path, saved, rename)

    def command(payload):
        entry = payload["history"][0]
        entry["commanf"] = entry.pop("command")

    assert "the history of commands differ" in _edited(tmp_path, saved, command)


def test_two_tensors_swapped_with_their_digest_entries_are_refused(tmp_path, saved):
    def swap(payload):
        state = payload["model"]["state_dict"]
        a, b = "layer1.0.weight", "layer2.0.weight"
        assert state[a].shape == state[b].shape
        state[a], state[b] = state[b], state[a]
        table = json.loads(payload["digests"])
        table["tensors"][a], table["tensors"][b] = table["tensors"][b], table["tensors"][a]
        payload["digests"] = json.dumps(table)

    assert "the model's weights, structure or flags differ" in _edited(tmp_path, saved, swap)


def test_a_damaged_first_byte_is_named_as_damage(tmp_path, saved):
    data, _ = saved
    path = tmp_path / "first.pt"
    path.write_bytes(bytes([data[0] ^ 0x01]) + data[1:])
    message = _outcome(path)
    assert message is not None and "damaged" in message
    assert "Python objects or code" not in message


def test_sections_cover_every_top_level_entry(saved):
    data, _ = saved
    payload = torch.load(io.BytesIO(data), weights_only=True)
    _, _, sections = integrity.saved_digests(payload)
    assert set(sections) == set(payload) - {"digests"}
