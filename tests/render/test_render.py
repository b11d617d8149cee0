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
from torchmagic.core.training.fit_events import EpochMetrics, FitHistory, StepInfo


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
    from torchmagic.core.training.fit_events import EpochMetrics, FitHistory

    run = FitHistory(
        "fit 1", "model", (EpochMetrics(1, 1.0, None, None, 8, 1.0, (0.1,)),), 1, 8, 1.0
    )
    charts = []
    monkeypatch.setattr(
        render.chart, "history_chart", lambda h, sequential=False: charts.append(h) or "<img/>"
    )
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


def test_html_tables_size_to_the_output():
    """A table is a <table> the browser sizes (max-width 100%) with every column, the
    most important on the left, whatever the text width; JupyterLab's
    ``code {white-space: pre-wrap}`` and centred 0.5em cells are kept out (no <code>,
    inline rules); names and numbers never wrap, prose wraps only between words, and
    the block around it scrolls sideways where words alone are wider."""
    lrs = (1e-3, 1e-4, 1e-5, 2e-5, 3e-5, 4e-5)
    wide = FitHistory("fit 1", "m", (EpochMetrics(1, 1.0, 0.9, 0.5, 8, 1.0, lrs),), 1, 8, 1.0)
    narrow = render.fit_history(wide, width=60)
    assert "hidden at 60 columns" in str(narrow)  # the text hides columns ...
    html_text = narrow._repr_mimebundle_(include={"text/html"})["text/html"]
    parsed = _Tags()
    parsed.feed(html_text)
    names = [tag for tag, _ in parsed.tags]
    assert "code" not in names  # ... the HTML keeps them all, the browser hides them
    (outer_tag, outer), (block_tag, block), (style_tag, _), (title_tag, _) = parsed.tags[:4]
    assert outer_tag == "div" and _rules(outer)["overflow-x"].startswith("auto")
    # the table's own block scrolls (its scrollbar under it) and hides by its width
    assert block_tag == "div" and _rules(block)["overflow-x"].startswith("auto")
    assert _rules(block)["container-type"] == "inline-size" and style_tag == "style"
    assert title_tag == "div"  # above the table: it wraps at the output's width
    table = dict(parsed.tags)["table"]
    assert names.index("table") > 1 and _rules(table)["max-width"] == "100%"
    assert _rules(table)["margin"].startswith("0")  # not centred
    heads = _Text.of(html_text, "th")
    assert heads[:3] == ["epoch", "train loss", "val loss"]
    assert len(heads) == 4 + len(lrs) + 2  # and time and samples/s at the end
    cells = [rules for tag, rules in parsed.tags if tag in ("td", "th")]
    assert all(_rules(rules)["white-space"] == "pre" for rules in cells)  # no prose here
    assert all("padding" in _rules(rules) for rules in cells)
    # the text after the table (the run's ending) is in a <pre> that wraps at spaces only
    pre = dict(parsed.tags)["pre"]
    assert _rules(pre)["white-space"] == "pre-wrap !important"
    assert _rules(pre)["word-break"] == "normal !important"
    assert "completed" in html.unescape(parsed.text)


def test_html_prose_cells_wrap_between_words_only():
    """Only prose wraps in HTML, and keeps each word in a no-wrap span: browsers would
    otherwise also break after a hyphen or a slash (``1e-4…0.001``, ``samples/s``). A
    short cell that may wrap in text (a group list, an lr with its base) stays on one
    line: the table scrolls rather than wrap a row's names and numbers."""
    drawn = render.base.table(
        "t", [("name", "left"), ("prose", "left"), ("lr", "left")], whole=("name",)
    )
    drawn.add_row(
        "layer1-3", "the lr spread 1e-4…0.001 over the selected blocks", "base 1e-4 · now 2e-5"
    )
    html_text = render.Rendered(drawn, 40).html()
    assert '<span style="white-space:nowrap">1e-4…0.001</span>' in html_text
    assert ">layer1-3</td>" in html_text
    cells = [s for t, s in _tags(html_text) if t == "td"]
    assert [_rules(s)["white-space"] for s in cells] == ["pre", "normal", "pre"]


def _tags(text: str) -> list[tuple[str, str]]:
    parsed = _Tags()
    parsed.feed(text)
    return parsed.tags


class _Text(HTMLParser):
    """The text of each element with a given tag."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag, self.depth, self.texts = tag, 0, []

    @classmethod
    def of(cls, text: str, tag: str) -> list[str]:
        parser = cls(tag)
        parser.feed(text)
        return parser.texts

    def handle_starttag(self, tag, attrs):
        if tag == self.tag:
            self.depth += 1
            self.texts.append("")

    def handle_endtag(self, tag):
        self.depth -= tag == self.tag

    def handle_data(self, data):
        if self.depth:
            self.texts[-1] += data


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
        from torchmagic.core.training.fit_events import EpochMetrics, FitHistory
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
    assert "lr head: 1.00e-3, layer4: 1.00e-4" in text and "0.42 samples/s" in text
    assert max(map(len, text.splitlines())) <= 100  # nothing cropped
    progress.on_step(StepInfo(2, 3, 131, 31, 120, 300.0, 1.4, (1e-3, 1e-3)))
    assert "lr 1.00e-3 ·" in str(handle.drawn[-1])  # one lr when the groups share it


def test_validation_is_shown_while_it_runs():
    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 100, clock=clock)
    progress.on_step(StepInfo(1, 1, 7, 7, 8, 10.0, 0.5, (0.1,)))
    progress.on_validation_start(1, 40)
    assert "validating on 40 batches" in str(handle.drawn[-1])
    assert "7/8" not in str(handle.drawn[-1])  # no stale bar


def test_closing_leaves_the_table_and_one_line_and_finish_puts_the_result_there():
    """Each epoch end is drawn at once; when the run closes the live block becomes one
    line; ``finish`` draws the result in the same output: the run's facts once."""
    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 100, clock=clock)
    progress.on_step(StepInfo(1, 2, 485, 485, 500, 10.0, 0.5, (0.1,)))
    progress.on_epoch(EpochMetrics(1, 0.5, 0.4, 0.75, 5000, 9.0, (0.1,)))
    after_epoch = str(handle.drawn[-1])
    assert "485/500" not in after_epoch and "75.0%" in after_epoch
    assert "epoch 2/2 · starting…" in after_epoch
    clock.now = 20.0
    progress.on_stop("interrupted; the last completed step is 485")
    progress.close()
    closed = str(handle.drawn[-1]).splitlines()
    assert (
        closed[-1]
        == "1 of 2 epochs in 00:20 · stopped: interrupted; the last completed step is 485"
    )
    assert sum("75.0%" in line for line in closed) == 1 and "epochs done" not in str(closed)
    drawn = len(handle.drawn)
    history = FitHistory(
        "fit 1", "m", (EpochMetrics(1, 0.5, 0.4, 0.75, 5000, 9.0, (0.1,)),), 485, 5000, 20.0
    )
    result = render.render(history, 100)
    progress.finish(result)
    assert len(handle.drawn) == drawn + 1 and handle.drawn[-1] is result  # the same output
    progress.finish()  # without a result: the output stays as the run left it
    assert len(handle.drawn) == drawn + 1


def _block(view: render.Rendered, table_rows: int) -> list[str]:
    """The live block: the lines after the start line and the epoch table."""
    lines = str(view).splitlines()
    return lines[1 + (table_rows + 2 if table_rows else 0) :]


def test_the_live_block_keeps_its_height_and_shows_the_whole_run():
    """A run bar (epochs done / total, elapsed<remaining for the run), the epoch's bar
    and the numbers: three lines from the start, while validating and between epochs."""
    from torchmagic.core.training.fit_events import FitStart

    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 100, clock=clock)
    progress.on_start(FitStart("fit 1", "m", 4, None, "fp32", False, ()))
    starting = _block(handle.drawn[-1], 0)
    assert starting[0].endswith("0/4 epochs done · run 00:00")
    assert "epoch 1/4 · starting…" in starting[1]
    clock.now = 30.0
    progress.on_step(StepInfo(1, 4, 5, 5, 10, 100.0, 2.0, (0.1,)))
    stepping = _block(handle.drawn[-1], 0)
    # half of one epoch of four in 30 s: 4 minutes for the run, 3:30 left
    assert stepping[0].endswith("0/4 epochs done · run 00:30<03:30")
    assert stepping[1].endswith("epoch 1/4 · step 5/10 · 00:30<00:30")
    clock.now = 60.0
    progress.on_validation_start(1, 3)
    validating = _block(handle.drawn[-1], 0)
    assert "validating on 3 batches" in validating[1]
    clock.now = 80.0
    progress.on_epoch(EpochMetrics(1, 2.0, 1.9, 0.5, 50, 60.0, (0.1,)))
    between = _block(handle.drawn[-1], 1)
    assert between[0].endswith("1/4 epochs done · run 01:20<04:00")
    assert "epoch 2/4 · starting…" in between[1]
    assert between[2].startswith("loss 2.0000 · lr 1.00e-1")  # the last numbers, dimmed
    heights = {len(b) for b in (starting, stepping, validating, between)}
    assert heights == {3}
    bars = [line.split(" ")[0] for line in (*stepping[:2], between[0])]
    assert [bar.count("━") for bar in bars] == [4, 15, 8]  # 1/8, 1/2, 1/4 of 30


def test_a_new_run_starts_a_new_count():
    """%fine_tune sends two runs to one observer: each counts its own epochs."""
    from torchmagic.core.training.fit_events import FitStart

    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 100, clock=clock)
    progress.on_start(FitStart("fit 1", "m", 1, None, "fp32", False, ()))
    progress.on_epoch(EpochMetrics(1, 2.0, 1.9, 0.5, 50, 6.0, (0.1,)))
    progress.close()
    assert str(handle.drawn[-1]).splitlines()[-1] == "1 of 1 epoch in 00:00"
    progress.on_start(FitStart("fit 2", "m", 2, None, "fp32", False, ()))
    assert "0/2 epochs done" in str(handle.drawn[-1])
    for epoch in (1, 2):
        progress.on_epoch(EpochMetrics(epoch, 1.0, 0.9, 0.7, 50, 6.0, (0.1,)))
    progress.close()
    text = str(handle.drawn[-1])
    lines = text.splitlines()
    # the first run stays in view above the second, as it ended (fine_tune's phase 1)
    assert lines[0].startswith("fit 1 · m") and "1 of 1 epoch in 00:00" in lines
    assert lines.index("1 of 1 epoch in 00:00") < lines.index(
        next(line for line in lines if line.startswith("fit 2 · m"))
    )
    assert lines[-1] == "2 of 2 epochs in 00:00"


def test_a_narrow_live_view_shortens_its_bars_not_its_words():
    handle, clock = _Handle(), _Clock()
    progress = render.NotebookProgress(handle.show, 60, clock=clock)
    progress.on_step(StepInfo(1, 3, 130, 30, 120, 0.42, 1.5, (1e-3,)))
    lines = str(handle.drawn[-1]).splitlines()
    assert len(lines) == 3 and max(map(len, lines)) <= 60
    assert lines[1].endswith("epoch 1/3 · step 30/120 · 00:00<00:00")


def test_lr_find_progress_names_the_bound_schedulers():
    from torchmagic.core.training.fit_events import FitStart

    handle = _Handle()
    progress = render.NotebookProgress(handle.show, 120, clock=_Clock())
    progress.on_start(
        FitStart("lr_find", "m", 0, 100, "fp32", False, (), held=("CosineAnnealingLR",))
    )
    progress.on_step(StepInfo(1, 1, 25, 25, 100, 10.0, 2.0, (1e-4,)))
    first, bar, numbers = str(handle.drawn[-1]).splitlines()
    assert first == (
        "lr_find · m · fp32 · 100 steps · "
        "schedulers: CosineAnnealingLR (not stepped; restored after)"
    )
    assert bar.endswith("step 25/100 · 00:00<00:00") and "epoch" not in bar
    assert numbers.startswith("loss 2.0000 · lr 1.00e-4")


def test_columns_keep_their_decimals_and_lrs_their_width():
    from torchmagic.render.training import numbers

    assert numbers([2.314, 2.234, 2.2, 2.177]) == ["2.314", "2.234", "2.200", "2.177"]
    assert numbers([2.3, None, 0.0123]) == ["2.30000", "", "0.01230"]
    assert [render.training.lr_fixed(v) for v in (0.1, 2.5e-3, 0.0)] == ["1.00e-1", "2.50e-3", "0"]
    lrs = (1e-3, 5e-4, 9.29e-6, 0.1)
    epochs = tuple(
        EpochMetrics(i + 1, loss, None, None, 8, 1.0, (lr,))
        for i, (loss, lr) in enumerate(zip((2.314, 2.234, 2.2, 2.177), lrs, strict=True))
    )
    text = str(render.fit_history(FitHistory("fit 1", "m", epochs, 4, 32, 4.0), 100))
    rows = [line for line in text.splitlines() if "│" in line]
    # the first loss decides (one digit of room): a row added never rewrites those above
    assert [row.split("│")[1].strip() for row in rows] == ["2.3140", "2.2340", "2.2000", "2.1770"]
    assert [row.split("│")[2].strip() for row in rows] == [  # the lr column, after the loss
        "1.00e-3",
        "5.00e-4",
        "9.29e-6",
        "1.00e-1",
    ]
    # the live table: the lr column is as wide after the schedule moved the lr as before
    widths = []
    for shown in range(1, 5):
        drawn = str(render.Rendered(render.training.epoch_table(epochs[:shown]), 100))
        widths.append(len(drawn.splitlines()[0]))
    assert len(set(widths)) == 1


def test_epoch_table_names_groups_and_explains_time():
    epochs = (EpochMetrics(1, 1.0, None, None, 8, 2.0, (1e-3, 1e-4)),)
    text = str(render.fit_history(FitHistory("fit 1", "m", epochs, 1, 8, 2.0)))
    header = text.splitlines()[1]
    assert "time (s)" in header and "lr group 0" in header and "lr group 1" in header
    assert "val acc" not in header  # no validation, no empty columns


def test_terminal_progress_is_transient_and_finish_prints_the_result_once():
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
    assert "step 3/10" in text and "loss 0.500" in text
    erased = len(out.getvalue())
    history = FitHistory(
        "fit 1", "m", (EpochMetrics(1, 0.5, 0.4, 0.75, 100, 1.0, (1e-3,)),), 3, 100, 1.0
    )
    progress.finish(render.render(history, 100))
    printed = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()[erased:])
    assert printed.startswith("fit 1 · m · fp32 · 3 steps")  # …and the result is printed once
    assert printed.count("75.0%") == 1 and "epochs done" not in printed


def test_terminal_progress_without_a_result_prints_each_run_as_it_ended():
    import io

    from rich.console import Console

    out = io.StringIO()
    progress = render.TerminalProgress(console=Console(file=out, width=100), clock=_Clock())
    progress.on_step(StepInfo(1, 2, 3, 3, 10, 120.0, 0.5, (1e-3,)))
    progress.on_epoch(EpochMetrics(1, 0.5, 0.4, 0.75, 100, 1.0, (1e-3,)))
    progress.close()
    progress.finish()
    assert out.getvalue().rstrip().endswith("1 of 2 epochs in 00:00")


def test_html_marks_the_key_columns_ui_check_looks_for():
    """The header of every column no width hides carries data-tm-key (the summary's
    module, state and params), the others do not."""
    from test_golden import CASES

    html_text = render.render(CASES["summary"](), width=100).html()
    summary = html_text.split("<table")[1]
    keyed = [
        "".join(_Text.of(f"<th{head}", "th"))
        for head in summary.split("<th")[1:]
        if "data-tm-key" in head.split(">")[0]
    ]
    assert keyed == ["module", "state", "params"]


def test_html_cells_keep_their_own_styles(resnet):
    """A cell that is a styled Text (a state's colour, a link) keeps its style in the
    HTML, drawn from its own segments as rich would draw it."""
    import torch

    from torchmagic import Session

    tm = Session(resnet, torch.optim.SGD(resnet.parameters(), lr=0.1))
    tm.freeze("layer1")
    html_text = render.render(tm.summary(depth=1), 100).html()
    for state in ("frozen", "trainable", "partial"):
        assert re.search(rf'<span style="[^"]*color:[^"]*">{state}</span>', html_text), state
