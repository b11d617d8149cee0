"""%replace_head on a head carrying LoRA adapters is refused in one line, nothing changed."""

import pytest

from builders import resnet18_sgd
from snapshots import assert_same, snapshot
from torchmagic import Session
from torchmagic.core.errors import TorchMagicError

pytest.importorskip("peft")


def _adapted():
    return resnet18_sgd()


def test_session_refuses_a_head_with_adapters():
    model, opt = _adapted()
    tm = Session(model, opt)
    tm.lora("fc", r=2)
    before = snapshot(model, opt)
    with pytest.raises(TorchMagicError) as caught:
        tm.replace_head("fc", 7)
    assert "\n" not in str(caught.value) and "fc has LoRA adapters" in str(caught.value)
    assert_same(before, snapshot(model, opt))


def test_magic_refuses_a_head_with_adapters(ip):
    model, opt = _adapted()
    ip.user_ns.update(model=model, optimizer=opt)
    ip.run_line_magic("lora", "fc r=2")
    before = snapshot(model, opt)
    with pytest.raises(Exception) as caught:
        ip.run_line_magic("replace_head", "fc 7")
    assert "\n" not in str(caught.value).strip() and "LoRA adapters" in str(caught.value)
    assert_same(before, snapshot(model, opt))
