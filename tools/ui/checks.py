"""What ui-check asserts about a probed page: plain data in (from probe.js and heights.js),
failures out, so each rule is unit-tested without a browser (tests/project/test_ui_check.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Magics that print nothing on success, so a missing output is no finding.
SILENT_MAGICS = frozenset({"load_ext", "reload_ext", "unload_ext", "config", "matplotlib"})
ERROR_LINE = re.compile(r"^(Traceback \(most recent call last\)|\w*(Error|Exception):)", re.M)
SCROLLBAR_ROOM = 24.0  # px between a scrolling table's bottom and its scroller's: the bar


def line_box_count(boxes: Sequence[Sequence[float]], tolerance: float = 1.0) -> int:
    """How many line boxes a text line occupies, from the (top, bottom) of its client rects.

    Inline elements report rects slightly taller or shorter than their text, so rects that
    overlap vertically (beyond ``tolerance`` px) belong to the same line box.
    """
    count, bottom = 0, float("-inf")
    for top, box_bottom in sorted((float(t), float(b)) for t, b in boxes):
        if top >= bottom - tolerance:
            count += 1
            bottom = box_bottom
        else:
            bottom = max(bottom, box_bottom)
    return count


def wrapped_lines(lines: Sequence[dict[str, Any]]) -> list[str]:
    """The text lines of one ``<pre>`` that the browser broke over several line boxes."""
    return [line["text"] for line in lines if line_box_count(line["boxes"]) > 1]


def hidden_keys(table: dict[str, Any], tolerance: float = 1.0) -> list[str]:
    """The key columns of one probed table that sit outside its visible span."""
    left, right = table["visibleLeft"] - tolerance, table["visibleRight"] + tolerance
    return [k["text"] for k in table["keys"] if k["left"] < left or k["right"] > right]


def hidden_fixes(findings: dict[str, Any], tolerance: float = 1.0) -> list[str]:
    """The fixes of one probed ``%tm doctor`` findings block with a line box outside the
    part of the output one sees (the fix is the point of a finding)."""
    box = findings["visible"]
    return [
        fix["text"]
        for fix in findings["fixes"]
        if not fix["boxes"]
        or any(
            left < box["left"] - tolerance
            or right > box["right"] + tolerance
            or top < box["top"] - tolerance
            or bottom > box["bottom"] + tolerance
            for left, top, right, bottom in fix["boxes"]
        )
    ]


def split_numbers(numbers: Sequence[dict[str, Any]]) -> list[str]:
    """The numbers (with their units) that the browser broke over two line boxes."""
    return [n["text"] for n in numbers if line_box_count(n["boxes"]) > 1]


def far_scrollbar(table: dict[str, Any]) -> float | None:
    """How far below a sideways-scrolling table its scrollbar sits, when further than the
    bar itself (text between them: the bar is not where the eye looks for it)."""
    gap = table["scroller"]["bottom"] - table["bottom"]
    return gap if gap > SCROLLBAR_ROOM else None


def shrinks(
    heights: Sequence[Sequence[float]], tolerance: float = 1.0
) -> list[tuple[int, float, float]]:
    """(ms, from, to) for every drop in an output's height after its first draw, from the
    (ms, height) samples taken while it ran: progress keeps one height to the final view."""
    drops, tallest = [], None
    for ms, height in heights:
        if tallest is None:
            tallest = height if height > 0 else None
            continue
        if height < tallest - tolerance:
            drops.append((int(ms), float(tallest), float(height)))
        tallest = max(tallest, height)
    return drops


def judge_heights(records: dict[str, Any], sources: dict[str, str], combo: Combo) -> None:
    """Every watched (``%fit`` / ``%fine_tune``) cell: drawn, and never shorter again."""
    for index, source in sources.items():
        samples = records.get(index, {"heights": [], "samples": 0})
        where = f"cell `{_snippet(source.splitlines()[0], 40)}`"
        combo.check(any(h > 0 for _, h in samples["heights"]), f"{where}: never drawn")
        drops = shrinks(samples["heights"])
        combo.check(
            not drops,
            f"{where}: output shrank {len(drops)} time(s), first "
            + (f"{drops[0][1]:.0f} -> {drops[0][2]:.0f} px at {drops[0][0]} ms" if drops else ""),
        )


def magic_name(source: str) -> str | None:
    """The line magic a cell starts with (first non-blank, non-comment line), if any."""
    for line in source.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            match = re.match(r"%%?([A-Za-z_]\w*)", line)
            return match.group(1) if match else None
    return None


def is_error_output(output: dict[str, Any]) -> bool:
    """An error output, or stderr text carrying a traceback or an ``XError:`` line."""
    if output["outputType"] == "error":
        return True
    stderr = output["mimeType"] == "application/vnd.jupyter.stderr"
    return stderr and ERROR_LINE.search(output["text"]) is not None


_RGB = re.compile(r"rgba?\(\s*([\d.]+)[,\s]+([\d.]+)[,\s]+([\d.]+)(?:\s*[,/]\s*([\d.]+%?))?\s*\)")


_SRGB = re.compile(r"color\(srgb\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)(?:\s*/\s*([\d.]+%?))?\s*\)")


def _alpha(text: str | None) -> float:
    return 1.0 if text is None else float(text[:-1]) / 100 if text.endswith("%") else float(text)


def parse_css_color(text: str) -> tuple[float, float, float, float]:
    """``rgb()``/``rgba()`` (0-255) or ``color(srgb …)`` (0-1) as computed styles report them."""
    text = text.strip()
    if match := _RGB.fullmatch(text):
        r, g, b, a = match.groups()
        return float(r), float(g), float(b), _alpha(a)
    if match := _SRGB.fullmatch(text):
        r, g, b, a = match.groups()
        return float(r) * 255, float(g) * 255, float(b) * 255, _alpha(a)
    raise ValueError(f"not a computed colour: {text!r}")


def _luminance(rgb: Sequence[float]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(color: str, background: str) -> float:
    """WCAG contrast of a (possibly translucent) text colour over an opaque background."""
    *fg, alpha = parse_css_color(color)
    bg = parse_css_color(background)[:3]
    blended = [alpha * f + (1 - alpha) * b for f, b in zip(fg, bg, strict=True)]
    light, dark = sorted((_luminance(blended), _luminance(bg)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


@dataclass
class Combo:
    """The checks of one notebook in one theme at one width."""

    notebook: str
    theme: str
    width: int
    folder: Path
    checks: int = 0
    failures: list[str] = field(default_factory=list)
    output_width: float = 0.0  # the widest magic output, px
    findings: int = 0  # doctor findings whose fix was probed

    def check(self, ok: bool, failure: str) -> None:
        self.checks += 1
        if not ok:
            self.failures.append(failure)


def _snippet(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def judge(page: dict[str, Any], combo: Combo, min_contrast: float) -> None:
    """Every assertion on one probed page (see tools/ui/probe.js for the data)."""
    code_number = 0
    for cell in page["cells"]:
        if cell["type"] != "code" or not cell["source"].strip():
            continue
        code_number += 1
        where = f"cell {code_number} `{_snippet(cell['source'].splitlines()[0], 40)}`"
        unran = "still queued or running at --timeout" if "*" in cell["prompt"] else "did not run"
        combo.check(cell["executionCount"] is not None, f"{where}: {unran}")
        for output in cell["outputs"]:
            combo.check(
                not is_error_output(output), f"{where}: error output: {_snippet(output['text'])}"
            )
        magic = magic_name(cell["source"])
        if magic is None:
            continue
        if magic not in SILENT_MAGICS:
            shown = any(o["present"] for o in cell["outputs"])
            combo.check(shown, f"{where}: no output shown")
        for output in cell["outputs"]:
            _judge_output(output, where, combo, min_contrast)


def _judge_output(output: dict[str, Any], where: str, combo: Combo, min_contrast: float) -> None:
    """The assertions on one output of a magic cell."""
    combo.output_width = max(combo.output_width, output.get("width", 0.0))
    for lines in output["pres"]:
        wrapped = wrapped_lines(lines)
        combo.check(
            not wrapped,
            f"{where}: {len(wrapped)} of {len(lines)} lines wrap, "
            f"e.g. {_snippet(wrapped[0]) if wrapped else ''!r}",
        )
    if output.get("numbers"):
        cut = split_numbers(output["numbers"])
        combo.check(not cut, f"{where}: numbers broken over two lines: {cut[:3]}")
    for drawn in output.get("tables", []):
        title = _snippet(drawn["title"], 40)
        outside = hidden_keys(drawn)
        combo.check(
            not outside,
            f"{where}: key columns {', '.join(outside)} of table {title!r} are right of "
            f"the visible output ({drawn['visibleRight']:.0f} px)",
        )
        if drawn.get("hidden"):
            combo.check(
                drawn["hiddenNamed"],
                f"{where}: table {title!r} hides {drawn['hidden']} column(s) without the "
                "line that names them",
            )
        if drawn.get("scroller") and drawn["scroller"]["scrolls"]:
            gap = far_scrollbar(drawn)
            combo.check(
                gap is None,
                f"{where}: the scrollbar of table {title!r} is {gap or 0:.0f} px below it",
            )
    for findings in output.get("findings", []):
        combo.findings += len(findings["fixes"])
        combo.check(bool(findings["fixes"]), f"{where}: a findings block without a fix drawn")
        outside = hidden_fixes(findings)
        combo.check(
            not outside,
            f"{where}: {len(outside)} fix(es) outside the visible output, "
            f"e.g. {_snippet(outside[0]) if outside else ''!r}",
        )
    if min_contrast > 0:
        for pair in output["colours"]:
            try:
                ratio = contrast_ratio(pair["color"], pair["background"])
            except ValueError as exc:
                combo.check(False, f"{where}: {exc}")
                continue
            combo.check(
                ratio >= min_contrast,
                f"{where}: contrast {ratio:.1f}:1 for {pair['color']} on "
                f"{pair['background']} ({_snippet(pair['sample'], 30)!r})",
            )


def summary_table(combos: Sequence[Combo]) -> str:
    """notebook x theme x width -> passed/failed counts, one row each."""
    header = ("notebook", "theme", "width", "passed", "failed", "screenshots")
    rows = [
        (
            c.notebook,
            c.theme,
            str(c.width),
            str(c.checks - len(c.failures)),
            str(len(c.failures)),
            shown_path(c.folder),
        )
        for c in combos
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    numeric = {2, 3, 4}

    def fmt(row: Sequence[str]) -> str:
        cells = (
            v.rjust(w) if i in numeric else v.ljust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(r) for r in rows)])


def shown_path(path: Path) -> str:
    """``path`` relative to the current folder where it is under it (for the report)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
