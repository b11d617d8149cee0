"""``%summary --input-shape``: each module's output shape and bytes from one forward of
a meta-device replica, as Keras' and torchinfo's summaries show them. The model, its
BatchNorm statistics and the random state are untouched; a model that cannot run on the
meta device, or an input that does not fit, is refused in one line naming the module."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch import nn

from torchmagic import Session, TorchMagicError, render
from torchmagic.core.surgery.shapes import output_shapes


def test_resnet_rows_carry_their_output_shapes(resnet) -> None:
    report = Session(resnet).summary(input_shape=(2, 3, 64, 64))
    rows = {row.name: row for row in report.rows}
    assert rows["model"].output.shape == (2, 1000)
    assert rows["conv1"].output.shape == (2, 64, 32, 32)
    assert rows["layer4"].output.shape == (2, 512, 2, 2)
    assert rows["conv1"].output.nbytes == 2 * 64 * 32 * 32 * 4
    assert rows["relu"].output.calls == 1  # resnet's own relu; the blocks' are theirs
    assert report.shapes is not None and report.shapes.input_shape == (2, 3, 64, 64)
    leaves = [m for m in resnet.modules() if not m._modules]
    assert report.shapes.activation_bytes > rows["conv1"].output.nbytes * 3
    assert len(report.shapes.outputs) == len(list(resnet.modules()))  # every module ran
    assert len(leaves) < len(report.shapes.outputs)


def test_the_model_and_the_random_state_are_untouched(resnet) -> None:
    resnet.train()
    state = {k: v.clone() for k, v in resnet.state_dict().items()}
    rng = torch.get_rng_state()
    calls = []
    resnet.register_forward_hook(lambda *_: calls.append(1))
    output_shapes(resnet, (1, 3, 32, 32))
    assert calls == []  # the replica ran, not the model
    assert resnet.training and all(p.device.type == "cpu" for p in resnet.parameters())
    assert all(torch.equal(v, state[k]) for k, v in resnet.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_several_outputs_and_token_inputs() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.lstm = nn.LSTM(8, 6, batch_first=True)

        def forward(self, ids):
            return self.lstm(self.embed(ids))

    shapes = output_shapes(Pair(), (2, 7))  # token ids: the input is made long
    assert shapes.outputs["embed"].shape == (2, 7, 8)
    assert shapes.outputs["lstm"].shape == (2, 7, 6) and shapes.outputs["lstm"].tensors == 3


def test_a_shape_that_does_not_fit_names_the_module(resnet) -> None:
    with pytest.raises(TorchMagicError) as info:
        Session(resnet).summary(input_shape=(1, 4, 32, 32))
    message = str(info.value)
    assert info.value.param == "input_shape" and "\n" not in message
    assert message == (
        "input_shape (1, 4, 32, 32) does not fit the model: conv1 (Conv2d) takes (batch, 3, "
        "H, W); give the shape batch first, e.g. (1, 3, 224, 224), or leave it out"
    )


def test_a_module_that_reads_values_is_refused_by_name() -> None:
    class Gate(nn.Module):
        def forward(self, x):
            return x if x.sum().item() > 0 else -x  # a value: meta tensors have none

    model = nn.Sequential(nn.Linear(3, 3), Gate(), nn.Linear(3, 2))
    with pytest.raises(TorchMagicError, match=r"failed in 1 \(Gate\)"):
        Session(model).summary(input_shape=(1, 3))


def test_lazy_modules_are_refused() -> None:
    with pytest.raises(TorchMagicError, match="lazy modules"):
        Session(nn.Sequential(nn.LazyLinear(3))).summary(input_shape=(1, 3))


def test_the_magic_and_its_alias(ip, resnet) -> None:
    ip.user_ns["model"] = resnet
    with capture_output() as cap:
        ip.run_line_magic("summary", "--depth 1 --input-shape 1,3,64,64")
        ip.run_line_magic("summary", "--depth 1 --input-size 1x3x64x64")
    first, second = (o.data["text/plain"] for o in cap.outputs)
    assert first == second and "1×64×32×32" in first and "activations" in first
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("summary", "--input-shape 3,32")
    assert str(refused.value).startswith("--input-shape (3, 32) does not fit the model: conv1 ")
    assert "Error" not in str(refused.value) and "conv2d" not in str(refused.value)
    with pytest.raises(UsageError, match="expected positive integers"):
        ip.run_line_magic("summary", "--input-shape 1,a")


@pytest.mark.parametrize("width", [60, 80, 100])
def test_the_totals_fit_the_tables_width(resnet, width) -> None:
    report = Session(resnet).summary(depth=1, input_shape=(1, 3, 64, 64))
    lines = str(render.render(report, width)).splitlines()
    table = max(len(line) for line in lines if "│" in line)
    totals = [line for line in lines if " · " in line]
    assert len(totals) >= 2 and all(len(line) <= table for line in totals)


def test_the_totals_wrap_between_facts_in_html(resnet) -> None:
    """The browser wraps the totals at the cell's width: each fact is one unbreakable
    span, and a line breaks only after the ``·`` between two (never before it)."""
    page = render.render(Session(resnet).summary(depth=1), 100).html()
    block = page[page.index('class="torchmagic-facts"') :].split("</div>")[0]
    parts = block.split('white-space:nowrap">')[1:]
    facts = [part.split("</span>")[0] for part in parts]
    assert all(part.endswith('</span>&nbsp;· <span style="') for part in parts[:-1])
    assert facts[0].startswith("total 11.7M params") and facts[-1] == "depth 1"
    text = str(render.render(Session(resnet).summary(depth=1), 100))
    assert len(facts) == 5 and all(fact in text for fact in facts)  # the text's own facts
