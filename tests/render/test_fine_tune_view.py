"""What %fit / %fine_tune show while they run and after: many
groups' lrs as the head's and a range, the head's lr, time and samples/s kept at a narrow
width, one height across a run's close, fine_tune's freeze summary and first run in view
while the second runs, and its chart drawing the runs one after the other."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from builders import blobs
from torchmagic import Session, render
from torchmagic.core.training.fit_events import EpochMetrics, FitHistory, FitStart, StepInfo
from torchmagic.render import chart
from torchmagic.render.training import lr_fixed

NAMES = tuple(f"block{i}" for i in range(7)) + ("fc",)
LRS = tuple(1e-4 * 1.78**i for i in range(7)) + (1e-2,)  # the head's last, the largest


class Handle:
    """A notebook display handle that keeps every drawing."""

    def __init__(self) -> None:
        self.drawn: list[render.Rendered] = []

    def show(self, drawn: render.Rendered) -> Handle:
        self.drawn.append(drawn)
        return self

    def update(self, drawn: render.Rendered) -> None:
        self.drawn.append(drawn)


def _eight_groups_step(epoch: int = 1, batch: int = 2) -> StepInfo:
    return StepInfo(epoch, 2, batch, batch, 4, 120.0, 0.8765, LRS, groups=NAMES, head=7)


def _eight_groups_epochs() -> tuple[EpochMetrics, ...]:
    return tuple(
        EpochMetrics(e, 1.0 / e, 1.1 / e, 0.5, 64, 2.0, LRS, groups=NAMES, head=7) for e in (1, 2)
    )


def test_eight_groups_lrs_read_as_the_heads_and_the_others_range_on_one_line():
    handle = Handle()
    progress = render.NotebookProgress(handle.show, 80, clock=lambda: 0.0)
    progress.on_start(FitStart("fit 1", "model", 2, None, "fp32", False, ()))
    progress.on_step(_eight_groups_step())
    (numbers,) = [line for line in str(handle.drawn[-1]).splitlines() if line.startswith("loss")]
    others = f"7 others {lr_fixed(min(LRS[:7]))}–{lr_fixed(max(LRS[:7]))}"
    assert numbers == f"loss 0.87650 · lr fc: {lr_fixed(1e-2)}, {others} · 120 samples/s"
    assert not any(name in numbers for name in NAMES[:7])


def _header(text: str) -> list[str]:
    (header,) = [line for line in text.splitlines() if line.lstrip().startswith("epoch ┃")]
    return [cell.strip() for cell in header.split("┃")]


def test_eight_groups_table_puts_the_heads_lr_time_and_samples_first_and_hides_the_others_first():
    history = FitHistory("fit 1", "model", _eight_groups_epochs(), 8, 128, 4.0)
    wide = _header(str(render.fit_history(history, 240)))
    assert wide == [
        "epoch",
        "train loss",
        "val loss",
        "val acc",
        "lr fc",
        "time (s)",
        "samples/s",
        *(f"lr {name}" for name in NAMES[:7]),
    ]
    text = str(render.fit_history(history, 100))
    narrow = _header(text)
    assert narrow[:7] == wide[:7] and len(narrow) < len(wide)
    assert max(len(line) for line in text.splitlines()) <= 100
    hidden = " ".join(text.split()).split("hidden at 100 columns: ")[1].split(" schedulers")[0]
    assert hidden.split(", ") == wide[len(narrow) :]  # only other groups' lrs, the last first
    tight = _header(str(render.fit_history(history, 56)))  # the others went first
    assert tight[:5] == wide[:5] and not any(c.startswith("lr block") for c in tight)


def _frames(handle: Handle) -> list[list[str]]:
    return [str(drawn).splitlines() for drawn in handle.drawn]


def _run(progress: render.NotebookProgress, label: str, epochs: int) -> None:
    progress.on_start(FitStart(label, "model", epochs, None, "fp32", False, ()))
    for epoch in range(1, epochs + 1):
        for batch in range(1, 5):
            progress.on_step(StepInfo(epoch, epochs, batch, batch, 4, 50.0, 0.9, (1e-3,)))
        progress.on_validation_start(epoch, 2)
        progress.on_epoch(EpochMetrics(epoch, 0.9, 0.8, 0.5, 32, 1.0, (1e-3,)))
    progress.close()


def test_the_view_keeps_its_height_across_the_close_and_never_shrinks():
    handle = Handle()
    progress = render.NotebookProgress(handle.show, 100, clock=lambda: 0.0)
    _run(progress, "fit 1", 3)
    heights = [len(frame) for frame in _frames(handle)]
    assert heights[-1] == heights[-2]  # the close: the same lines, the block's last one says so
    assert heights == sorted(heights)  # only an epoch's row adds a line
    assert _frames(handle)[-1][-1] == "3 of 3 epochs in 00:00"
    # a second run (fine_tune's) draws below the first, which stays as it ended
    _run(progress, "fit 2", 2)
    heights = [len(frame) for frame in _frames(handle)]
    assert heights == sorted(heights) and heights[-1] == heights[-2]


def _fine_tune(observer: object | None = None, blocks: int = 2):
    """A real fine_tune of a model with ``blocks`` bodies and a head ``fc``."""
    torch.manual_seed(0)
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        (f"block{i}", nn.Sequential(nn.Linear(8, 8), nn.ReLU())) for i in range(blocks)
    )
    layers["fc"] = nn.Linear(8, 4)
    model = nn.Sequential(layers)
    session = Session(model, torch.optim.SGD(model.parameters(), lr=1e-2))
    train = DataLoader(TensorDataset(*blobs(64, seed=0)), batch_size=16)
    val = DataLoader(TensorDataset(*blobs(32, seed=1)), batch_size=32)
    return session.fine_tune(train, val=val, epochs=2, observer=observer)


def test_fine_tune_keeps_the_freeze_and_the_first_run_in_view_while_the_second_runs():
    handle = Handle()
    result = _fine_tune(render.NotebookProgress(handle.show, 100, clock=lambda: 0.0))
    second = [f for f in _frames(handle) if any(line.startswith("fit 2 ·") for line in f)]
    assert second  # the second run drew
    for frame in second:
        text = "\n".join(frame)
        order = [text.index(s) for s in ("froze ", "fit 1 ·", "1 of 1 epoch in", "unfroze ")]
        assert order == sorted(order) and order[-1] < text.index("fit 2 ·")
    heights = [len(frame) for frame in _frames(handle)]
    assert heights == sorted(heights)  # nothing above ever goes
    assert [len(h.epochs) for h in render.render(result).histories] == [1, 2]


def test_eight_groups_fine_tune_table_keeps_the_heads_lr_time_and_samples_at_80_columns():
    result = _fine_tune(blocks=7)
    text = str(render.render(result, 80))
    (header,) = [
        line
        for line in text.splitlines()
        if line.lstrip().startswith("epoch ┃") and "lr fc" in line
    ]
    cells = [cell.strip() for cell in header.split("┃")]
    assert cells[4:7] == ["lr fc", "time (s)", "samples/s"]
    hidden = " ".join(text.split()).split("hidden at 80 columns: ")[1].split(" schedulers")[0]
    assert hidden.split(", ") == [f"lr block{i}" for i in range(7)]
    assert max(len(line) for line in text.splitlines()) <= 80


def _figure(monkeypatch, view: render.Rendered):
    """The figure the view's HTML draws (captured on its way to SVG)."""
    drawn = []
    real = chart.figure_svg
    monkeypatch.setattr(
        chart, "figure_svg", lambda fig, label: drawn.append(fig) or real(fig, label)
    )
    html = view._repr_mimebundle_(include={"text/html"})["text/html"]
    assert "<svg" in html
    (fig,) = drawn
    return fig


def _xs(fig, label: str) -> list[float]:
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == label]
    return [float(x) for x in line.get_xdata()]


def test_fine_tune_chart_draws_the_second_run_after_the_first_with_the_boundary_marked(
    monkeypatch,
):
    pytest.importorskip("matplotlib")
    result = _fine_tune()
    fig = _figure(monkeypatch, render.render(result))
    first, second = _xs(fig, "fit 1 train"), _xs(fig, "fit 2 train")
    assert first == [1.0] and second == [2.0, 3.0]  # one after the other, not over epoch 1
    assert _xs(fig, "fit 2 val") == second
    for ax in fig.axes:  # the loss and the accuracy panel
        marks = [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":"]
        assert marks == [1.5]  # between the runs
    assert [t.get_text() for t in fig.axes[0].texts] == ["fit 2"]
    assert fig.axes[0].get_xlim() == (0.75, 3.25)


def test_runs_compared_side_by_side_still_start_at_epoch_one(monkeypatch):
    pytest.importorskip("matplotlib")
    epochs = tuple(EpochMetrics(e, 1.0 / e, None, None, 8, 1.0, (0.1,)) for e in (1, 2))
    runs = (
        FitHistory("fit 1", "m", epochs, 2, 16, 2.0),
        FitHistory("fit 2", "m", epochs, 2, 16, 2.0),
    )
    fig = _figure(monkeypatch, render.render(render.FitRuns(runs)))
    assert _xs(fig, "fit 1 train") == _xs(fig, "fit 2 train") == [1.0, 2.0]
    assert not fig.axes[0].texts
