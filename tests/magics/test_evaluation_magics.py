"""%evaluate and %predict in a shell: what they bind and show (text and HTML: the heat
map, the worst inputs as pictures), --against, and one-line refusals."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from torchmagic.core.evaluation import Evaluation, Prediction

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
images = torch.rand(30, 3, 4, 4)
val_loader = DataLoader(TensorDataset(images, torch.arange(30) % 3), batch_size=8)
"""


def _run(ip, line: str):
    with capture_output() as captured:
        result = ip.run_cell(line)
    result.raise_error()
    return result.result, captured


def test_evaluate_binds_shows_and_reads_like_its_result(ip):
    ip.run_cell(SETUP).raise_error()
    _, captured = _run(ip, "%evaluate model val_loader --worst 4 --top 2 --as ev")
    ev = ip.user_ns["ev"]
    assert isinstance(ev, Evaluation) and len(ev.worst) == 4 and ev.top_k == 2
    bundle = captured.outputs[0].data
    text, html = bundle["text/plain"], bundle["text/html"]
    assert "evaluated `model` on `val_loader`: 30 samples" in text
    assert "per class" in text and "confusion" in text and "the 4 largest losses" in text
    assert "<svg" in html and "confusion matrix" in html
    assert html.count('<img src="data:image/png;base64,') == 4
    returned, _ = _run(ip, "again = %evaluate val_loader")
    assert ip.user_ns["again"].accuracy == ev.accuracy  # reads through to the Evaluation


def test_against_an_earlier_evaluation(ip):
    ip.run_cell(SETUP).raise_error()
    _run(ip, "%evaluate model val_loader --as before")
    _run(ip, "%replace_head auto labels=a,b,c")
    _, captured = _run(ip, "%evaluate model val_loader --against before --as after")
    comparison = ip.user_ns["after"].comparison
    assert comparison is not None
    assert f"{comparison.fixed} fixed / {comparison.broken} broken" in captured.stdout + str(
        captured.outputs[0].data["text/plain"]
    )
    assert ip.user_ns["after"].labels == ("a", "b", "c")
    _run(ip, "ev = %evaluate val_loader")
    _run(ip, "%evaluate val_loader --against ev")  # the value a bare assignment bound


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("%evaluate model val_loader --worst -1", "--worst must be a whole number"),
        ("%evaluate model val_loader --top 0", "--top must be a positive"),
        ("%evaluate model val_loader --against images", "--against images is a Tensor"),
        ("%evaluate model val_loader --against nothing", "--against nothing: no variable"),
        ("%evaluate model val_loader extra", "one model and one loader, got 3 words"),
        ("%evaluate model val_loader --loss cross_entropie", "unknown loss 'cross_entropie'"),
        ("%evaluate model val_loader --as 1x", "'1x' is not a variable name"),
        ("%predict model missing.png", "'missing.png' is neither a variable nor a file"),
        ("%predict model images --top 0", "--top must be a positive"),
    ],
)
def test_refusals_are_one_line_and_change_nothing(ip, line, match):
    ip.run_cell(SETUP).raise_error()
    before = {k: v.clone() for k, v in ip.user_ns["model"].state_dict().items()}
    names = set(ip.user_ns)
    with pytest.raises(UsageError, match=match) as info:
        ip.run_line_magic(line.split()[0][1:], line.partition(" ")[2])
    assert "\n" not in str(info.value)
    after = ip.user_ns["model"].state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert set(ip.user_ns) == names


def test_predict_a_tensor_variable(ip):
    ip.run_cell(SETUP).raise_error()
    _run(ip, "%replace_head auto labels=red,green,blue")
    ip.run_cell("one = images[0]").raise_error()
    returned, captured = _run(ip, "found = %predict model one --top 2")
    found = ip.user_ns["found"]
    assert found.labels[0] in ("red", "green", "blue") and len(found.labels) == 2
    assert isinstance(found.view.result, Prediction)
    text = captured.outputs[0].data["text/plain"]
    assert found.labels[0] in text and "%" in text
    _, captured = _run(ip, "%predict images --top 1")
    assert "on 30 inputs" in captured.outputs[0].data["text/plain"]


def test_help_is_the_docstring_and_the_arguments(ip):
    doc = ip.find_line_magic("evaluate").__doc__
    assert "--worst" in doc and "--against" in doc and "eval mode" in doc
    assert "--transforms" in ip.find_line_magic("predict").__doc__
