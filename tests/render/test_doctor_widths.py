"""``%tm doctor`` with findings at 60, 80 and 100 columns and in HTML: every fix is drawn
whole, no line is wider than the terminal, and HTML lets the fix move below."""

from __future__ import annotations

import pytest

from torchmagic.core.diagnostics.doctor import DoctorReport, Finding
from torchmagic.render import render

FIX = "run %unfreeze fc: it adds the new head and keeps the optimizer's state"
REPORT = DoctorReport(
    findings=(
        Finding("head-swapped", "error", "optimizer", "the old head is in the optimizer", FIX),
        Finding(
            "idle-state",
            "warning",
            "model.layer4.0.downsample",
            "frozen keep state",
            "free it",
            4_194_304,
        ),
    ),
    scanned=("model", "optimizer"),
)


@pytest.mark.parametrize("width", (60, 80, 100))
def test_findings_fit_the_width_and_show_every_fix(width: int) -> None:
    text = str(render(REPORT, width=width))
    assert all(len(line) <= width for line in text.splitlines()), text
    assert FIX in " ".join(line.strip(" │") for line in text.splitlines()).replace("  ", " ")
    assert "(4.0 MiB)" in text


def test_narrow_findings_stack_below_one_line_of_severity_check_where() -> None:
    lines = str(render(REPORT, width=60)).splitlines()
    assert "error · head-swapped · optimizer" in lines
    assert "warning · idle-state · model.layer4.0.downsample" in lines
    assert "  → free it" in lines


def test_html_findings_wrap_the_fix_below_and_keep_a_size_whole() -> None:
    html = render(REPORT, width=100).html()
    assert html.count("flex-wrap:wrap") == 3  # the head row and one per finding
    assert "<table" not in html
    assert '<span style="white-space:nowrap">(4.0 MiB)</span>' in html
