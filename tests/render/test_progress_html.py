"""The live %fit view keeps one height in the browser too, as a browser lays
its HTML out: a bar line never wraps (its bar gives way, in proportion) and the closed
block's leading blank line survives HTML's rule that drops a newline right after <pre>.
``make ui-check`` measures the same in Chromium; this is the rule without one."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from torchmagic import render
from torchmagic.core.training.fit_events import EpochMetrics, FitStart, StepInfo
from torchmagic.render.progress import BAR_WIDTH, BarLine


class _Lines(HTMLParser):
    """Lines a browser gives a torchmagic drawing when nothing wraps: a <pre>'s text lines
    (less the newline right after its start tag, which HTML drops), one per bar line, one
    per table row."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.pre, self.in_bar = 0, None, 0

    def handle_starttag(self, tag, attrs):
        if tag == "pre":
            self.pre = ""
        elif tag == "tr":
            self.count += 1
        elif tag == "div" and ("class", "torchmagic-bar") in attrs:
            self.count += 1

    def handle_data(self, data):
        if self.pre is not None:
            self.pre += data

    def handle_endtag(self, tag):
        if tag == "pre" and self.pre is not None:
            text = self.pre[1:] if self.pre.startswith("\n") else self.pre
            self.count += len(text.split("\n"))
            self.pre = None


def _lines(drawn: render.Rendered) -> int:
    parser = _Lines()
    parser.feed(drawn.html())
    return parser.count


class _Handle:
    def __init__(self) -> None:
        self.drawn: list[render.Rendered] = []

    def show(self, drawn: render.Rendered) -> _Handle:
        self.drawn.append(drawn)
        return self

    def update(self, drawn: render.Rendered) -> None:
        self.drawn.append(drawn)


def test_the_html_view_never_loses_a_line_across_the_close():
    handle = _Handle()
    progress = render.NotebookProgress(handle.show, 80, clock=lambda: 0.0)
    progress.on_start(FitStart("fit 1", "model", 2, None, "fp32", False, ()))
    for epoch in (1, 2):
        progress.on_step(StepInfo(epoch, 2, 1, epoch, 2, 50.0, 0.9, (1e-3,)))
        progress.on_epoch(EpochMetrics(epoch, 0.9, 0.8, 0.5, 32, 1.0, (1e-3,)))
    progress.close()
    heights = [_lines(drawn) for drawn in handle.drawn]
    assert heights == sorted(heights) and heights[-1] == heights[-2]


def test_a_leading_blank_line_of_a_pre_survives_the_html_rule():
    drawn = render.Rendered(render.base.Group(render.base.Text(""), "after"), 40)
    assert _lines(drawn) == 2


def test_a_bar_line_is_one_line_whose_bar_shrinks_in_proportion():
    bar = BarLine(0.4, "epoch 1/2 · step 3/6 · 00:02<00:03")
    html = bar.html()
    done, todo = round(BAR_WIDTH * 0.4), BAR_WIDTH - round(BAR_WIDTH * 0.4)
    assert f"flex:0 1 {done}ch;min-width:0" in html and f"flex:0 1 {todo}ch;min-width:0" in html
    assert 'class="torchmagic-bar" style="display:flex;white-space:pre;' in html
    text = re.sub(r"<[^>]+>", "", html).replace("&lt;", "<")
    assert text == str(render.Rendered(bar, 80))  # the same characters as the text drawing


def test_a_bar_line_without_a_total_is_its_words_alone():
    html = BarLine(None, "step 12 · 00:04").html()
    assert "━" not in html and "─" not in html and "step" in html
