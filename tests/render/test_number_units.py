"""In text, a number is never split from its unit ("2.4" / "s", "17.4" /
"GiB", "data wait 0" / "%", "27.2" / "samples/s"), at any width, in prose, in table
cells and in the terminal's live drawing; the drawn text is the text given."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from rich.text import Text

from torchmagic import render
from torchmagic.core.training.fit_events import EpochMetrics, FitHistory
from torchmagic.render.base import Fitted

STATUS = "step 12/40 · loss 0.523 · 27.2 samples/s · data wait 0 % · 17.4 GiB of 80.0 GiB · 2.4 s"
UNIT_FIRST = re.compile(r"^\s*(?:[KMGT]iB|B|s|ms|%|samples/s)(?![A-Za-z/])")


def _splits(text: str) -> list[tuple[str, str]]:
    lines = text.splitlines()
    pairs = zip(lines, lines[1:], strict=False)
    return [(a, b) for a, b in pairs if re.search(r"\d$", a.rstrip()) and UNIT_FIRST.match(b)]


def _table():
    table = render.base.table("memory", [("what", "left"), ("size", "right")])
    table.add_row("weights and optimizer state of the model", "17.4 GiB")
    table.add_row("activations at batch 64", "2.4 GiB")
    return table


@pytest.mark.parametrize("width", range(14, 61, 3))
def test_prose_never_splits_a_number_from_its_unit(width: int) -> None:
    drawn = str(render.Rendered(Text(STATUS, style="bold"), width))
    assert not _splits(drawn)
    assert drawn.split() == STATUS.split()  # every space given back, none lost
    assert "\ue000" not in render.Rendered(Text(STATUS), width).html()


@pytest.mark.parametrize("width", [20, 26, 32, 40])
def test_a_table_cell_and_a_fit_ending_keep_their_units(width: int) -> None:
    epochs = (EpochMetrics(1, 1.0, 0.9, 0.5, 8, 2.4, (1e-3,)),)
    history = FitHistory("fit 1", "m", epochs, 1, 8, 2.4)
    for drawn in (str(render.Rendered(_table(), width)), str(render.fit_history(history, width))):
        assert not _splits(drawn) and "\ue000" not in drawn
        assert "17.4 GiB" in drawn or "2.4 s" in drawn


def test_the_terminal_drawing_gets_its_spaces_back() -> None:
    out = io.StringIO()
    Console(file=out, width=22, color_system=None).print(Fitted(Text(STATUS)))
    drawn = out.getvalue()
    assert "\ue000" not in drawn and not _splits(drawn)
    assert drawn.split() == STATUS.split()


def test_before_the_fix_rich_alone_splits_them() -> None:
    """The case is real: rich on its own breaks "27.2 samples/s" at this width."""
    out = io.StringIO()
    Console(file=out, width=20, color_system=None).print(Text(STATUS))
    assert _splits(out.getvalue())


def test_a_pre_in_html_keeps_each_number_with_its_unit_on_one_line() -> None:
    """A <pre> wraps at spaces (pre-wrap): the %gpumem footer broke "20.4" / "GiB" at a
    ~450 px output, so each number and its unit is one no-wrap run there too."""
    drawn = render.Rendered(Text(STATUS), 200).html()
    for pair in ("27.2 samples/s", "0 %", "17.4 GiB", "80.0 GiB", "2.4 s"):
        assert f'<span style="white-space:nowrap">{pair}</span>' in drawn
    assert '<span style="white-space:nowrap">loss' not in drawn  # other words may wrap
