"""The pure parts of tools/ui_check.py: wrap detection, page judgement, contrast, CLI.

The browser run itself is `make ui-check`; these tests feed it the data the page probe
returns, so they need neither JupyterLab nor Chromium.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_ui_check() -> ModuleType:
    """tools/ui_check.py, imported by path (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("ui_check", ROOT / "tools/ui_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ui_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


ui = _load_ui_check()

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
    args = ui.parse_args([])
    assert args.notebooks == ("quickstart", "all_magics")
    assert args.themes == ("light", "dark")
    assert args.widths == (1400, 900)


def test_command_line_subsets_keep_the_order_given():
    args = ui.parse_args(["--notebooks", "all_magics", "--themes", "dark,light", "--widths", "900"])
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
        ui.parse_args(argv)
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
    for path in ui.NOTEBOOKS.values():
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
