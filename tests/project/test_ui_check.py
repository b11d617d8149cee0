"""The pure parts of make ui-check (tools/ui/checks.py, tools/ui_check.py): wrap detection,
page judgement, contrast, fixes in view, numbers whole, progress heights, CLI.

The browser run itself is `make ui-check`; these tests feed it the data the page probe
returns, so they need neither JupyterLab nor Chromium.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from paths import ROOT


def _tools() -> tuple[ModuleType, ModuleType]:
    """tools/ui/checks.py (the rules) and tools/ui_check.py (the command line), imported
    with tools/ on the path as the script has it (tools/ is no package)."""
    sys.path.insert(0, str(ROOT / "tools"))
    return importlib.import_module("ui.checks"), importlib.import_module("ui_check")


ui, cli = _tools()

LINE = 18.0  # one line box, in px


def boxes(*rows: int, height: float = 16.0, jitter: float = 0.0) -> list[list[float]]:
    """Client rects (top, bottom) on the given line-box rows."""
    return [[row * LINE + jitter, row * LINE + jitter + height] for row in rows]


def test_one_row_of_rects_is_one_line_box():
    assert ui.line_box_count(boxes(0, 0, 0)) == 1


def test_taller_inline_rects_on_the_same_row_are_still_one_line_box():
    # a <b> or coloured <span> reports a rect a little above and below its text
    rects = boxes(0, 0) + [[-1.5, 17.5]]
    assert ui.line_box_count(rects) == 1


def test_rects_on_two_rows_are_two_line_boxes_in_any_order():
    assert ui.line_box_count(boxes(1, 0, 1)) == 2
    assert ui.line_box_count(boxes(0, 1, 2)) == 3


def test_no_rects_is_no_line_box():
    assert ui.line_box_count([]) == 0


def test_wrapped_lines_names_the_lines_that_wrap():
    lines = [
        {"text": "module | params", "boxes": boxes(0, 0)},
        {"text": "layer1 | 240 | trainable", "boxes": boxes(1, 1, 2)},
    ]
    assert ui.wrapped_lines(lines) == ["layer1 | 240 | trainable"]


def _page(*cells: dict) -> dict:
    return {"cells": list(cells)}


def _cell(source: str, *outputs: dict, count: int | None = 1) -> dict:
    return {
        "index": 0,
        "type": "code",
        "source": source,
        "executionCount": count,
        "prompt": f"[{count}]:" if count else "[ ]:",
        "outputs": list(outputs),
    }


def _html(lines: list[dict] | None = None, colours: list[dict] | None = None) -> dict:
    return {
        "outputType": "display_data",
        "mimeType": "text/html",
        "text": "table",
        "present": True,
        "pres": [lines or [{"text": "a | b", "boxes": boxes(0)}]],
        "colours": colours or [],
    }


def _judge(page: dict, min_contrast: float = 3.0):
    combo = ui.Combo("nb", "light", 900, Path("build/ui/nb/light-900"))
    ui.judge(page, combo, min_contrast)
    return combo


def test_a_clean_page_passes_every_check():
    combo = _judge(_page(_cell("%summary", _html()), _cell("x = 1")))
    assert combo.failures == []
    assert combo.checks == 5  # two ran; summary: its output no error, shown, its <pre> fits


def test_a_wrapped_row_fails_and_names_the_cell():
    lines = [{"text": "layer1 | 240", "boxes": boxes(0, 1)}]
    combo = _judge(_page(_cell("x = 1"), _cell("%summary --depth 1", _html(lines))))
    assert len(combo.failures) == 1
    assert "cell 2 `%summary --depth 1`" in combo.failures[0]
    assert "1 of 1 lines wrap" in combo.failures[0]


def test_a_magic_without_output_fails_but_a_silent_magic_does_not():
    combo = _judge(_page(_cell("%load_ext torchmagic"), _cell("%tm history")))
    assert combo.failures == ["cell 2 `%tm history`: no output shown"]


def test_a_cell_that_did_not_run_fails():
    combo = _judge(_page(_cell("%summary", count=None)))
    assert any("did not run" in f for f in combo.failures)


def test_a_cell_still_queued_when_time_ran_out_says_so():
    queued = {**_cell("%fit train_loader", count=None), "prompt": "[*]:"}
    combo = _judge(_page(queued))
    assert combo.failures[0] == "cell 1 `%fit train_loader`: still queued or running at --timeout"


@pytest.mark.parametrize(
    ("output_type", "mime", "text", "is_error"),
    [
        ("error", "application/vnd.jupyter.stderr", "ValueError: no", True),
        ("stream", "application/vnd.jupyter.stderr", "UsageError: name what to freeze", True),
        ("stream", "application/vnd.jupyter.stderr", "Traceback (most recent call last):", True),
        ("stream", "application/vnd.jupyter.stderr", "UserWarning: deprecated\n  warn()", False),
        ("stream", "text/plain", "ValueError: printed by the user", False),
    ],
)
def test_error_outputs_are_tracebacks_error_lines_and_error_outputs(
    output_type, mime, text, is_error
):
    output = {"outputType": output_type, "mimeType": mime, "text": text}
    assert ui.is_error_output(output) is is_error


def test_an_error_output_fails_the_page():
    error = {
        **_html(),
        "outputType": "error",
        "mimeType": "application/vnd.jupyter.stderr",
        "text": "TorchMagicError: no module named 'layer9'",
        "pres": [],
    }
    combo = _judge(_page(_cell("%freeze layer9", error)))
    assert len(combo.failures) == 1 and "error output" in combo.failures[0]


def test_magic_name_skips_comments_and_blank_lines():
    assert ui.magic_name("# freeze the stem\n\n%freeze model.layer1") == "freeze"
    assert ui.magic_name("%%amp bf16\ny = model(x)") == "amp"
    assert ui.magic_name("model = make()\n%summary") is None


def test_contrast_ratio_matches_wcag_extremes_and_known_pairs():
    assert ui.contrast_ratio("rgb(0, 0, 0)", "rgb(255, 255, 255)") == pytest.approx(21.0)
    assert ui.contrast_ratio("rgb(17, 17, 17)", "rgb(17, 17, 17)") == pytest.approx(1.0)
    # the figure: #800080 on JupyterLab Dark's #111111 is about 2.0:1
    assert ui.contrast_ratio("rgb(128, 0, 128)", "rgb(17, 17, 17)") == pytest.approx(2.0, abs=0.1)


def test_translucent_text_is_blended_into_its_background():
    half = ui.contrast_ratio("rgba(0, 0, 0, 0.5)", "rgb(255, 255, 255)")
    assert 1.0 < half < ui.contrast_ratio("rgb(0, 0, 0)", "rgb(255, 255, 255)")


def test_parse_css_color_reads_srgb_colour_functions_as_color_mix_yields():
    assert ui.parse_css_color("color(srgb 1 0.5 0 / 0.5)") == (255.0, 127.5, 0.0, 0.5)


def test_an_unreadable_colour_is_a_finding_not_a_crash():
    odd = [{"color": "oklch(0.5 0.1 30)", "background": "rgb(0, 0, 0)", "sample": "x"}]
    combo = _judge(_page(_cell("%summary", _html(colours=odd))))
    assert any("not a computed colour" in f for f in combo.failures)


def test_parse_css_color_rejects_what_it_cannot_read():
    with pytest.raises(ValueError):
        ui.parse_css_color("color(display-p3 1 0 0)")


def test_low_contrast_text_fails_the_page_and_zero_turns_the_check_off():
    dim = [{"color": "rgb(128, 0, 128)", "background": "rgb(17, 17, 17)", "sample": "BatchNorm"}]
    page = _page(_cell("%freeze layer1", _html(colours=dim)))
    assert any("contrast 2.0:1" in f for f in _judge(page).failures)
    assert _judge(page, min_contrast=0).failures == []


def test_command_line_defaults_cover_everything():
    args = cli.parse_args([])
    assert args.notebooks == ("quickstart", "all_magics")
    assert args.themes == ("light", "dark")
    assert args.widths == (1400, 900)


def test_command_line_subsets_keep_the_order_given():
    args = cli.parse_args(
        ["--notebooks", "all_magics", "--themes", "dark,light", "--widths", "900"]
    )
    assert args.notebooks == ("all_magics",)
    assert args.themes == ("dark", "light")
    assert args.widths == (900,)


@pytest.mark.parametrize(
    "argv",
    [
        ["--notebooks", "nope"],
        ["--themes", "solarized"],
        ["--widths", "wide"],
        ["--widths", "100"],
        ["--themes", ""],
    ],
)
def test_command_line_rejects_unknown_values(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {argv[0]}:" in error and ("choose from" in error or "pixels" in error)


def test_summary_table_has_one_row_per_combination():
    ok = ui.Combo("quickstart", "light", 1400, Path("build/ui/quickstart/light-1400"), checks=10)
    bad = ui.Combo(
        "quickstart",
        "dark",
        900,
        Path("build/ui/quickstart/dark-900"),
        checks=10,
        failures=["x", "y"],
    )
    table = ui.summary_table([ok, bad]).splitlines()
    assert table[0].split() == ["notebook", "theme", "width", "passed", "failed", "screenshots"]
    assert table[2].split()[:5] == ["quickstart", "light", "1400", "10", "0"]
    assert table[3].split()[:5] == ["quickstart", "dark", "900", "8", "2"]


def test_every_notebook_the_check_runs_exists():
    for path in cli.NOTEBOOKS.values():
        assert (ROOT / path).is_file(), path


def _table(keys: list[tuple[str, float, float]], right: float = 800.0) -> dict:
    return {
        "title": "model (ResNet)",
        "keys": [{"text": t, "left": a, "right": b} for t, a, b in keys],
        "visibleLeft": 300.0,
        "visibleRight": right,
    }


def test_key_columns_inside_the_visible_output_pass():
    output = {**_html(), "tables": [_table([("module", 300, 380), ("params", 380, 440)])]}
    combo = _judge(_page(_cell("%summary", output)))
    assert combo.failures == [] and combo.checks == 5  # ran, no error, shown, <pre>, table


def test_a_key_column_right_of_the_visible_output_fails_and_names_it():
    """At 900 px with the file browser open, a key column reachable only by scrolling."""
    keys = [("module", 300, 380), ("state", 380, 790.5), ("params", 790, 860)]
    output = {**_html(), "tables": [_table(keys)]}
    combo = _judge(_page(_cell("%summary", output)))
    assert len(combo.failures) == 1
    assert "key columns params of table 'model (ResNet)'" in combo.failures[0]
    assert ui.hidden_keys(_table(keys, right=900.0)) == []


# -- the browser check: fixes in view, numbers whole, scrollbars, progress heights -------


def _findings(*fixes: list[list[float]]) -> dict:
    """One findings block seen in the box 300..800 x 0..400, with fixes' (l, t, r, b) rects."""
    return {
        "visible": {"left": 300.0, "top": 0.0, "right": 800.0, "bottom": 400.0},
        "fixes": [{"text": f"→ fix {i}", "boxes": rects} for i, rects in enumerate(fixes)],
    }


def test_a_fix_inside_the_visible_output_passes_and_counts():
    output = {**_html(), "findings": [_findings([[300, 10, 790, 26], [300, 28, 500, 44]])]}
    combo = _judge(_page(_cell("%tm doctor", output)))
    assert combo.failures == [] and combo.findings == 1


@pytest.mark.parametrize(
    "rect",
    [[300, 10, 830, 26], [280, 10, 500, 26], [300, 390, 500, 406]],
    ids=["right-of-the-output", "left-of-it", "below-its-height-limit"],
)
def test_a_fix_cut_by_the_output_fails_and_quotes_it(rect):
    output = {**_html(), "findings": [_findings([[300, 10, 500, 26]], [rect])]}
    (failure,) = _judge(_page(_cell("%tm doctor", output))).failures
    assert "1 fix(es) outside the visible output" in failure and "→ fix 1" in failure


def test_a_findings_block_without_a_fix_drawn_fails():
    output = {**_html(), "findings": [{"visible": _findings()["visible"], "fixes": []}]}
    (failure,) = _judge(_page(_cell("%tm doctor", output))).failures
    assert "without a fix drawn" in failure


def test_a_number_over_two_line_boxes_is_a_cut_number():
    numbers = [
        {"text": "696.2 MiB", "boxes": boxes(0, 0)},
        {"text": "20.4 GiB", "boxes": boxes(0) + boxes(1)},  # "20.4" / "GiB"
    ]
    assert ui.split_numbers(numbers) == ["20.4 GiB"]
    combo = _judge(_page(_cell("%gpumem", {**_html(), "numbers": numbers})))
    assert combo.failures == ["cell 1 `%gpumem`: numbers broken over two lines: ['20.4 GiB']"]


def _scrolling(gap: float, scrolls: bool = True) -> dict:
    return {**_table([]), "bottom": 500.0, "scroller": {"scrolls": scrolls, "bottom": 500 + gap}}


def test_a_scrollbar_right_below_its_table_passes_and_one_under_more_text_fails():
    assert ui.far_scrollbar(_scrolling(15.0)) is None
    assert ui.far_scrollbar(_scrolling(80.0)) == 80.0
    near = _judge(_page(_cell("%summary", {**_html(), "tables": [_scrolling(15.0)]})))
    far = _judge(_page(_cell("%summary", {**_html(), "tables": [_scrolling(80.0)]})))
    idle = _judge(_page(_cell("%summary", {**_html(), "tables": [_scrolling(80.0, False)]})))
    assert near.failures == [] and idle.failures == [] and idle.checks == near.checks - 1
    assert far.failures == [
        "cell 1 `%summary`: the scrollbar of table 'model (ResNet)' is 80 px below it"
    ]


def test_a_growing_progress_never_shrinks():
    assert ui.shrinks([[0, 0], [100, 84], [200, 138], [300, 154], [400, 318]]) == []


def test_a_drop_after_the_first_draw_is_found_even_when_it_grows_back():
    """The frames the check saw before the fix: 154 px, 117 px at the close, then 318."""
    heights = [[0, 0], [6086, 99.9], [6613, 153.7], [6637, 117.4], [7278, 317.6]]
    assert ui.shrinks(heights) == [(6637, 153.7, 117.4)]
    assert ui.shrinks([[0, 50], [10, 49.5]]) == []  # under a pixel: sub-pixel layout


def test_judge_heights_names_the_cell_that_shrank_and_the_one_never_drawn():
    records = {
        "3": {"samples": 40, "heights": [[0, 0], [50, 100], [90, 80]]},
        "5": {"samples": 40, "heights": [[0, 0]]},
        "7": {"samples": 40, "heights": [[0, 0], [50, 100], [90, 120]]},
    }
    sources = {"3": "%fit train_loader", "5": "%fine_tune a --val b", "7": "%fit x"}
    combo = ui.Combo("nb", "light run", 900, Path("build/ui/nb/run"))
    ui.judge_heights(records, sources, combo)
    assert combo.failures == [
        "cell `%fit train_loader`: output shrank 1 time(s), first 100 -> 80 px at 90 ms",
        "cell `%fine_tune a --val b`: never drawn",
    ]
    assert combo.checks == 6


def test_the_widest_output_is_noted_for_the_report():
    combo = _judge(_page(_cell("%summary", {**_html(), "width": 468.0})))
    assert combo.output_width == 468.0


def test_columns_hidden_without_the_line_naming_them_fail():
    named = {**_table([]), "hidden": 2, "hiddenNamed": True}
    silent = {**_table([]), "hidden": 2, "hiddenNamed": False}
    assert _judge(_page(_cell("%summary", {**_html(), "tables": [named]}))).failures == []
    (failure,) = _judge(_page(_cell("%summary", {**_html(), "tables": [silent]}))).failures
    assert "hides 2 column(s) without the line that names them" in failure
