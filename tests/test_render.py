from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser

import pytest

from torchmagic import Session, render
from torchmagic.core.training.fit import EpochMetrics, FitHistory, StepInfo


def test_change_has_text_and_html(trained):
    model, opt = trained
    change = Session(model, opt).freeze("layer1-3")
    bundle = render.change(change, width=90)._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    text = bundle["text/plain"]
    assert "froze layer1, layer2, layer3" in text and "held in eval" in text
    assert "changed" in text and "<pre" in bundle["text/html"]
    assert "layer1" in bundle["text/html"]
    assert max(len(line) for line in text.splitlines()) <= 90


def test_brackets_are_not_markup(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1", command="%freeze [weird] layer1")
    assert "[weird]" in str(render.history(tm.history()))


def test_long_module_lists_are_shortened(trained):
    model, opt = trained
    change = Session(model, opt).freeze("*.bn*", dry_run=True)
    text = str(render.change(change))
    assert "more" in text and text.count("bn") < 16


def test_bundle_computes_only_the_types_asked_for(monkeypatch):
    drawn = render.render("hello", width=40)
    assert set(drawn._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert set(drawn._repr_mimebundle_(exclude={"text/plain"})) == {"text/html"}
    assert drawn._repr_mimebundle_(include={"image/png"}) == {}
    exported = []
    monkeypatch.setattr(render.base, "_html_line", lambda line: exported.append(1) or "")
    drawn._repr_mimebundle_(exclude={"text/html"})
    assert exported == []


def test_history_chart_is_drawn_only_for_html(monkeypatch):
    from torchmagic.core.training.fit import EpochMetrics, FitHistory

    run = FitHistory(
        "fit 1", "model", (EpochMetrics(1, 1.0, None, None, 8, 1.0, (0.1,)),), 1, 8, 1.0
    )
    charts = []
    monkeypatch.setattr(render.chart, "history_chart", lambda h: charts.append(h) or "<img/>")
    view = render.render(render.FitRuns((run,)))
    assert set(view._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert charts == []
    assert view._repr_mimebundle_()["text/html"].endswith("<img/>")
    assert view.histories == (run,)


def test_lr_reads_as_typed():
    assert [render.lr(x) for x in (1e-4, 2.45e-6, 0.01, 0.001, 0.1, 0.0)] == [
        "1e-4",
        "2.45e-6",
        "0.01",
        "0.001",
        "0.1",
        "0",
    ]


def test_default_width_and_no_trailing_spaces(trained, monkeypatch):
    model, opt = trained
    monkeypatch.setattr(render.base, "in_kernel", lambda: True)
    drawn = render.render(Session(model, opt).summary(depth=1))
    assert drawn.width == render.DEFAULT_WIDTH
    text = str(drawn)
    assert text == drawn._repr_mimebundle_()["text/plain"]
    assert all(line == line.rstrip() for line in text.splitlines())


def test_terminal_width_follows_the_terminal(monkeypatch):
    """Outside a kernel the width is the terminal's; a configured width wins."""
    monkeypatch.setattr(render.base, "in_kernel", lambda: False)
    monkeypatch.setenv("COLUMNS", "61")
    assert render.render("hi").width == 61
    assert render.render("hi", width=0).width == 61
    assert render.render("hi", width=120).width == 120
    monkeypatch.setattr(render.base, "in_kernel", lambda: True)
    assert render.render("hi").width == render.DEFAULT_WIDTH


class _Tags(HTMLParser):
    """The elements of an HTML string with their inline styles, and the text inside <pre>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, str]] = []
        self.inside_pre = False
        self.text = ""

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs).get("style") or ""))
        self.inside_pre = self.inside_pre or tag == "pre"

    def handle_endtag(self, tag):
        self.inside_pre = self.inside_pre and tag != "pre"

    def handle_data(self, data):
        if self.inside_pre:
            self.text += data


def _rules(style: str) -> dict[str, str]:
    pairs = (rule.split(":", 1) for rule in style.split(";") if ":" in rule)
    return {name.strip(): value.strip() for name, value in pairs}


def test_html_rows_never_wrap_they_scroll():
    """JupyterLab's ``.jp-RenderedHTMLCommon code {white-space: pre-wrap}`` wrapped every
    row: no <code>; the <pre> keeps white-space:pre against any stylesheet rule
    (!important), and a block around it scrolls sideways."""
    lrs = (1e-3, 1e-4, 1e-5, 2e-5, 3e-5, 4e-5)
    wide = FitHistory("fit 1", "m", (EpochMetrics(1, 1.0, 0.9, 0.5, 8, 1.0, lrs),), 1, 8, 1.0)
    bundle = render.fit_history(wide, width=180)._repr_mimebundle_(include={"text/html"})
    bundle["text/plain"] = str(render.fit_history(wide, width=180))
    parsed = _Tags()
    parsed.feed(bundle["text/html"])
    names = [tag for tag, _ in parsed.tags]
    assert "code" not in names
    (outer_tag, outer), (pre_tag, pre) = parsed.tags[:2]
    assert outer_tag == "div" and _rules(outer)["overflow-x"].startswith("auto")
    assert pre_tag == "pre" and _rules(pre)["white-space"] == "pre !important"
    # every element inside the <pre> inherits white-space: only spans, without their own
    inside = names[2 : names.index("div", 2)] if "div" in names[2:] else names[2:]
    assert set(inside) <= {"span"}
    assert all("white-space" not in style for _, style in parsed.tags[2 : 2 + len(inside)])
    # the same lines as the text, none longer than the width asked for
    assert html.unescape(parsed.text) == bundle["text/plain"]
    assert max(map(len, bundle["text/plain"].splitlines())) > 100


def test_human_keeps_slow_rates():
    assert [render.human(x) for x in (0.42, 12.0, 256.3, 1234.5, 12_345_678)] == [
        "0.42",
        "12",
        "256",
        "1.23k",
        "12.3M",
    ]


def test_unnamed_groups_read_group_n(trained):
    """Unnamed param groups are "group 0", never "0" like a Sequential child."""
    model, opt = trained
    text = str(render.render(Session(model, opt).freeze("layer1")))
    assert "│ group 0 (changed) │" in text


def test_chart_keeps_the_users_matplotlib_backend():
    """Rendering a fit history draws without pyplot and leaves the backend alone (a fresh
    interpreter: the backend is process-global)."""
    pytest.importorskip("matplotlib")
    code = textwrap.dedent(
        """
        import sys
        import matplotlib
        matplotlib.use("pdf")
        from torchmagic import render
        from torchmagic.core.training.fit import EpochMetrics, FitHistory
        run = FitHistory("fit 1", "m", (EpochMetrics(1, 1.0, 0.9, 0.5, 8, 1.0, (0.1,)),), 1, 8, 1.0)
        html = render.render(run)._repr_mimebundle_()["text/html"]
        assert "<svg" in html, html[-300:]
        print(matplotlib.rcParams["backend"], "matplotlib.pyplot" in sys.modules)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("MPLBACKEND", None)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pdf", "False"]


def _svg_texts(view: render.Rendered) -> tuple[list[str], list[str]]:
    html_text = view._repr_mimebundle_()["text/html"]
    svg = html_text[html_text.index("<svg") :]
    return re.findall(r'<g id="(axes_\d+)"', svg), re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_chart_reads_in_both_themes_with_table_units():
    pytest.importorskip("matplotlib")
    epochs = tuple(
        EpochMetrics(e, 1.0 / e, 1.1 / e, 0.5 + e / 10, 8, 1.0, (0.1,)) for e in (1, 2, 3)
    )
    run = FitHistory("fit 1", "m", epochs, 3, 24, 3.0)
    axes, texts = _svg_texts(render.render(run))
    assert len(axes) == 2
    html_text = render.render(run)._repr_mimebundle_()["text/html"]
    assert "currentColor" in html_text and "#ffffff" not in html_text.lower()
    ticks = [t for t in texts if re.fullmatch(r"[\d.]+", t)]
    assert {"1", "2", "3"} <= set(ticks) and "1.5" not in ticks  # integer epochs
    assert "80" in ticks or "70" in ticks  # accuracy in %, not 0.7
    assert "val accuracy (%)" in texts


def test_chart_has_no_empty_accuracy_panel():
    pytest.importorskip("matplotlib")
    run = FitHistory("fit 1", "m", (EpochMetrics(1, 1.0, None, None, 8, 1.0, (0.1,)),), 1, 8, 1.0)
    axes, texts = _svg_texts(render.render(run))
    assert len(axes) == 1 and "val accuracy (%)" not in texts
    assert "1" in texts  # a single epoch still gets an integer tick


class _Handle:
    def __init__(self) -> None:
        self.drawn: list[render.Rendered] = []

    def show(self, rendered: render.Rendered) -> _Handle:
        self.drawn.append(rendered)
        return self

    def update(self, rendered: render.Rendered) -> None:
        self.drawn.append(rendered)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_draws_nothing_before_the_loop_starts():
    """A %fit refused up front leaves no "starting…" above its error."""
    handle = _Handle()
    progress = render.NotebookProgress(handle.show, 100)
    progress.close()
    assert handle.drawn == []


def test_progress_line_tells_the_whole_story():
    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 100, clock=clock)
    clock.now = 75.0
    progress.on_step(
        StepInfo(2, 3, 130, 30, 120, 0.42, 1.5, (1e-3, 1e-4), groups=("head", "layer4"))
    )
    text = str(handle.drawn[-1])
    assert "epoch 2/3" in text and "step 30/120" in text
    assert "01:15<03:45" in text  # elapsed<remaining, at this epoch's pace
    assert "lr head: 0.001, layer4: 1e-4" in text and "0.42 samples/s" in text
    assert max(map(len, text.splitlines())) <= 100  # two lines: nothing cropped
    progress.on_step(StepInfo(2, 3, 131, 31, 120, 300.0, 1.4, (1e-3, 1e-3)))
    assert "lr 0.001 ·" in str(handle.drawn[-1])  # one lr when the groups share it


def test_validation_is_shown_while_it_runs():
    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 100, clock=clock)
    progress.on_step(StepInfo(1, 1, 7, 7, 8, 10.0, 0.5, (0.1,)))
    progress.on_validation_start(1, 40)
    assert "validating on 40 batches" in str(handle.drawn[-1])
    assert "7/8" not in str(handle.drawn[-1])  # no stale bar


def test_finished_output_appears_once():
    """Each epoch end is drawn at once; at the end the live area shrinks to one line,
    the table being the cell's result."""
    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 100, clock=clock)
    progress.on_step(StepInfo(1, 2, 485, 485, 500, 10.0, 0.5, (0.1,)))
    progress.on_epoch(EpochMetrics(1, 0.5, 0.4, 0.75, 5000, 9.0, (0.1,)))
    after_epoch = str(handle.drawn[-1])
    assert "485/500" not in after_epoch and "75.0%" in after_epoch
    assert "epoch 2/2" in after_epoch
    drawn_before_close = len(handle.drawn)
    clock.now = 20.0
    progress.close()
    assert len(handle.drawn) == drawn_before_close + 1  # the same output, updated
    (last,) = str(handle.drawn[-1]).splitlines()
    assert last == "%fit: 1 of 2 epochs in 00:20 · train loss 0.5 · val acc 75.0%"


def test_epoch_table_names_groups_and_explains_time():
    epochs = (EpochMetrics(1, 1.0, None, None, 8, 2.0, (1e-3, 1e-4)),)
    text = str(render.fit_history(FitHistory("fit 1", "m", epochs, 1, 8, 2.0)))
    header = text.splitlines()[1]
    assert "time (s)" in header and "lr group 0" in header and "lr group 1" in header
    assert "val acc" not in header  # no validation, no empty columns


def test_terminal_progress_is_transient_and_ends_with_a_summary():
    import io

    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, highlight=False)
    progress = render.TerminalProgress(console=console, clock=_Clock())
    progress.on_step(StepInfo(1, 2, 3, 3, 10, 120.0, 0.5, (1e-3,)))
    progress.on_epoch(EpochMetrics(1, 0.5, 0.4, 0.75, 100, 1.0, (1e-3,)))
    progress.close()
    raw = out.getvalue()
    assert "\x1b[2K" in raw  # the live lines are erased…
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
    assert "step 3/10" in text and "loss 0.5" in text
    summary = "%fit: 1 of 2 epochs in 00:00 · train loss 0.5 · val acc 75.0%"
    assert text.rstrip().endswith(summary)  # …and the summary stays
