"""%amp, %%amp, %fit and %tm fits on a fresh shell."""

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from safetensors.torch import load_file

import torchmagic
from builders import TRAINING_CELL as SETUP
from cuda_fakes import fake_cuda
from torchmagic.core.training import amp as amp_module


def run(ip, source):
    result = ip.run_cell(source)
    result.raise_error()
    return result.result


def test_amp_status_on_off(ip, monkeypatch):
    monkeypatch.setattr(amp_module, "cpu_has_native_bf16", lambda: True)
    run(ip, SETUP)
    with capture_output() as cap:
        run(ip, "%amp")
        run(ip, "%amp on")
        run(ip, "%amp off")
    texts = [o.data["text/plain"] for o in cap.outputs]
    assert texts[0].startswith("AMP off")
    assert "autocast bf16 on cpu" in texts[1] and "no GradScaler" in texts[1]
    assert all("text/html" in o.data for o in cap.outputs)


def test_fp16_on_the_cpu_is_one_usage_error(ip):
    run(ip, SETUP)
    with pytest.raises(UsageError, match="use bf16 instead"):
        ip.run_line_magic("amp", "on fp16")
    assert "scaler" not in ip.user_ns


def test_fp16_binds_the_scaler_variable(ip, monkeypatch):
    fake_cuda(monkeypatch)
    run(ip, SETUP)
    torchmagic.notebook_session().device = torch.device("cuda")  # the logic, not a real GPU
    with capture_output():
        run(ip, "%amp on fp16")
    assert isinstance(ip.user_ns["scaler"], torch.amp.GradScaler)
    with capture_output():
        run(ip, "%amp off")
    assert "scaler" not in ip.user_ns


def test_cell_amp_runs_the_cell_under_autocast(ip):
    run(ip, SETUP)
    run(ip, "%%amp bf16\nout = model(x[:4])")
    assert ip.user_ns["out"].dtype is torch.bfloat16
    assert run(ip, "model(x[:4]).dtype") is torch.float32


@pytest.mark.parametrize(
    "words, fragment",
    [("bogus", "unknown precision 'bogus'"), ("bf16 fp16", "one precision at most")],
)
def test_cell_amp_bad_mode_runs_nothing(ip, words, fragment):
    run(ip, SETUP)
    with pytest.raises(UsageError, match=fragment):
        ip.run_cell_magic("amp", words, "ran = True")
    assert "ran" not in ip.user_ns
    assert not torchmagic.notebook_session().amp.enabled


def test_what_fit_and_lr_find_return_reads_like_the_result_they_show(ip):
    """docs: `%fit` returns the run's history (``history.epochs``, ``.steps``…), the
    lr_find result holds ``lrs``, ``losses``, ``suggestion``; `h = %fit …` is the habit."""
    run(ip, SETUP)
    with capture_output():
        run(ip, "h = %fit train --val val --epochs 2")
        run(ip, "r = %lr_find train --steps 5")
    h, r = ip.user_ns["h"], ip.user_ns["r"]
    (history,) = h.histories
    assert h.epochs == history.epochs and h.steps == history.steps > 0
    assert h.stop_reason is None and h.epochs[-1].val_accuracy is not None
    assert r.lrs == r.result.lrs and len(r.losses) == len(r.lrs) >= 2
    assert r.suggestion == r.result.suggestion
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        h.nonsense  # noqa: B018
    with capture_output():
        run(ip, "%fit train --epochs 1")
        fits = run(ip, "%tm fits")
    with pytest.raises(AttributeError):  # several runs: no one history to read
        fits.epochs  # noqa: B018


def test_fit_shows_progress_and_returns_history(ip):
    run(ip, SETUP)
    with capture_output() as cap:
        view = run(ip, "%fit train --val val --epochs 3")
    assert cap.outputs and all("text/html" in o.data for o in cap.outputs)
    (history,) = view.histories
    assert history.epochs[-1].val_accuracy > 0.8
    bundle = view._repr_mimebundle_()
    assert "val acc" in bundle["text/plain"] and "<table" not in bundle["text/plain"]
    with capture_output():
        run(ip, "%fit model train --epochs 1")
    with capture_output() as cap:
        run(ip, "%tm fits")
    text = cap.outputs[0].data["text/plain"]
    assert "fit 1" in text and "fit 2" in text


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("fit nope", "no variable named 'nope'"),
        ("fit train --epochs 0", "--epochs must be at least 1, got 0$"),
        ("fit train --max-steps 0", "--max-steps must be at least 1"),
        ("fit a b c", "^one model and one training loader, got 3 words: a b c$"),
        ("fit train --loss nope", "unknown loss"),
        (
            "fit train --val val --metric f1,nope",
            "^--metric: unknown metric 'nope'; the metrics are accuracy, f1, precision, "
            "recall, top5, auroc$",
        ),
        ("fit train --metric f1", "^--metric f1 is measured on the validation data: give --val"),
        ("fit train --val val --monitor nope", "^--monitor must be one of loss, acc, accuracy"),
        ("fit train --val val --metric top5", "^--metric top5 needs at least 5 classes"),
        ("fit train --val val --keep-best --export a.txt", "^--export 'a.txt' must end in one of"),
        ("fine_tune train --val val --epochs 1 --export a.py", "^--export 'a.py' must end in one"),
    ],
)
def test_fit_bad_input(ip, line, fragment):
    run(ip, SETUP)
    before = [p.detach().clone() for p in ip.user_ns["model"].parameters()]
    magic, _, rest = line.partition(" ")
    with pytest.raises(UsageError, match=fragment):
        ip.run_line_magic(magic, rest)
    after = list(ip.user_ns["model"].parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_fit_metrics_keep_best_and_export(ip, tmp_path):
    run(ip, SETUP)
    path = tmp_path / "best.safetensors"
    with capture_output():
        view = run(
            ip,
            f"%fit train --val val --epochs 3 --metric f1,auroc --monitor f1 --keep-best "
            f"--export {path}",
        )
    (history,) = view.histories
    assert history.metrics == ("f1", "auroc") and history.exported.path == str(path)
    f1 = [e.val_metrics["f1"] for e in history.epochs]
    assert history.best_epoch == f1.index(max(f1)) + 1
    written = load_file(path)
    for key, value in ip.user_ns["model"].state_dict().items():
        assert torch.equal(written[key], value)
    text = view._repr_mimebundle_()["text/plain"]
    assert "val f1" in text and "val auroc" in text and str(path) in text
    with capture_output() as cap:
        run(ip, "%tm fits")
    assert "best val f1" in cap.outputs[0].data["text/plain"]


def test_fine_tune_metric_and_export(ip, tmp_path):
    run(ip, SETUP)
    path = tmp_path / "tuned.safetensors"
    with capture_output():
        view = run(
            ip,
            f"%fine_tune train --val val --epochs 2 --metric f1 --keep-best --export {path}",
        )
    head, full = view.histories
    assert head.metrics == full.metrics == ("f1",)
    assert full.exported is not None and full.best_epoch is not None
    for key, value in load_file(path).items():
        assert torch.equal(value, ip.user_ns["model"].state_dict()[key])


def test_history_html_has_a_chart_when_matplotlib_is_installed(ip):
    run(ip, SETUP)
    with capture_output():
        view = run(ip, "%fit train --val val --epochs 2")
    html = view._repr_mimebundle_()["text/html"]
    assert 'aria-label="fit history chart"><svg' in html


def test_notebook_session_offers_autocast_and_step(ip):
    run(ip, SETUP)
    with capture_output():
        run(ip, "%amp on bf16")
    run(
        ip,
        """
import torchmagic
tm = torchmagic.notebook_session()
before = model[2].weight.detach().clone()
with tm.autocast():
    out = model(x[:8])
    loss = torch.nn.functional.cross_entropy(out, y[:8])
stepped = tm.step(loss, optimizer)
""",
    )
    ns = ip.user_ns
    assert ns["out"].dtype is torch.bfloat16 and ns["stepped"]
    assert not torch.equal(ns["before"], ns["model"][2].weight)
    assert ns["tm"] is torchmagic.notebook_session()


def test_terminal_progress_draws_a_bar_and_epoch_lines():
    import io

    from rich.console import Console

    from torchmagic import render
    from torchmagic.core.training.fit_events import EpochMetrics, StepInfo

    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, highlight=False)
    progress = render.TerminalProgress(console=console)
    progress.on_step(StepInfo(1, 2, 3, 3, 10, 120.0, 0.5, (1e-3,)))
    progress.on_epoch(EpochMetrics(1, 0.5, 0.4, 0.75, 100, 1.0, (1e-3,)))
    progress.close()
    progress.finish()  # no result to print: the view the run ended with
    text = out.getvalue()
    assert "3/10" in text and "loss 0.500" in text and "1 of 2 epochs" in text
    assert "75.0%" in text
