"""Run the example notebooks in a real JupyterLab in headless Chromium and check the page.

Unit tests see the HTML torchmagic emits; only a browser shows what JupyterLab's own CSS
does to it (a table row that wraps, a colour that vanishes on the dark theme). This tool
starts JupyterLab on 127.0.0.1 with a throw-away token, settings and workspace, opens each
notebook, clears it and runs all cells through the command palette, then for every theme
and window width takes screenshots (build/ui/) and asserts what the page can show:

* every code cell ran (it has an execution count),
* every magic cell has an output, and no output is an error or a traceback,
* no line of any ``<pre>`` in a magic's output that promises not to wrap
  (``white-space: pre``) wraps (each text line is one line box),
* every table's key columns (``<th data-tm-key>``: those no width hides, the table's
  most important) sit inside the part of the output one sees without scrolling sideways,
  with JupyterLab's file browser open beside the notebook,
* text in magic outputs keeps a minimum contrast against the background it sits on,
* every fix of a ``%tm doctor`` finding lies inside the part of the output one sees,
* no number is broken from its unit (or inside itself) over two lines,
* a table that scrolls sideways has its scrollbar right below it, not below other text,
* while the notebook runs (at the narrowest width, file browser open), the output of
  every ``%fit`` and ``%fine_tune`` cell, sampled every 100 ms and on every redraw, never
  gets shorter between its first draw and its final view (build/ui/<notebook>/run/).

At 900 px with the file browser open an output is about 450 px wide.

Each notebook runs once; themes and widths are then applied to the live page, as a user
would switch them. Exit status 1 when any check fails, 2 when the tools are missing.

Usage: python tools/ui_check.py [--notebooks quickstart,all_magics] [--themes light,dark]
                                [--widths 1400,900] [--out build/ui]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ui.browser import CHROMIUM_ARGS, WINDOW_HEIGHT, Plan, check_notebook
from ui.checks import Combo, shown_path, summary_table
from ui.lab import THEMES, jupyterlab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {"quickstart": "examples/quickstart.ipynb", "all_magics": "examples/all_magics.ipynb"}
DEFAULT_WIDTHS = (1400, 900)
CHROMIUM = "/usr/bin/chromium"


# -- command line --------------------------------------------------------------------------


def _choices(known: Sequence[str]):
    """argparse type: a comma-separated subset of ``known``, in the order given."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"choose from {', '.join(known)} (comma-separated), got {text!r}"
            )
        return names

    return parse


def _widths(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated window widths in CSS pixels."""
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        widths = ()
    if not widths or any(w < 320 or w > 4000 for w in widths):
        raise argparse.ArgumentTypeError(f"widths are pixels from 320 to 4000, got {text!r}")
    return widths


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; lists are comma-separated so a subset is one short flag."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--notebooks",
        type=_choices(tuple(NOTEBOOKS)),
        default=tuple(NOTEBOOKS),
        help=f"which notebooks (default: {','.join(NOTEBOOKS)})",
    )
    parser.add_argument(
        "--themes",
        type=_choices(tuple(THEMES)),
        default=tuple(THEMES),
        help=f"which themes (default: {','.join(THEMES)})",
    )
    parser.add_argument(
        "--widths",
        type=_widths,
        default=DEFAULT_WIDTHS,
        help="window widths in px (default: 1400,900)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "ui", help="screenshots")
    parser.add_argument(
        "--timeout", type=int, default=1800, help="seconds one notebook may take to run"
    )
    parser.add_argument(
        "--min-contrast",
        type=float,
        default=3.0,
        help="lowest text/background contrast ratio accepted in magic outputs (WCAG; 0: off)",
    )
    parser.add_argument("--chromium", default=CHROMIUM, help="the Chromium binary")
    return parser.parse_args(argv)


def _missing_tools(chromium: str) -> list[str]:
    missing = []
    for module, package in (
        ("playwright", "playwright"),
        ("jupyterlab", "jupyterlab"),
        ("ipykernel", "ipykernel"),
    ):
        try:
            __import__(module)
        except ImportError:
            missing.append(
                f"the Python package {package} ({sys.executable} -m pip install {package})"
            )
    if not (shutil.which(chromium) or Path(chromium).is_file()):
        missing.append(f"Chromium at {chromium} (Debian: apt-get install chromium)")
    return missing


def run(args: argparse.Namespace) -> list[Combo]:
    """Every requested notebook through one JupyterLab and one browser."""
    from playwright.sync_api import sync_playwright

    plan = Plan(args.themes, args.widths, args.out, args.timeout, args.min_contrast)
    originals = {n: (ROOT / NOTEBOOKS[n]).read_bytes() for n in args.notebooks}
    combos: list[Combo] = []
    with tempfile.TemporaryDirectory(prefix="tm-ui-check-") as scratch:
        scratch_dir = Path(scratch)
        try:
            with (
                jupyterlab(scratch_dir, args.themes[0], args.out / "jupyterlab.log") as lab,
                sync_playwright() as playwright,
            ):
                context = playwright.chromium.launch_persistent_context(
                    str(scratch_dir / "chromium-profile"),
                    executable_path=args.chromium,
                    headless=True,
                    args=list(CHROMIUM_ARGS),
                    viewport={"width": max(args.widths), "height": WINDOW_HEIGHT},
                )
                try:
                    for name in args.notebooks:
                        combos += check_notebook(context, lab, name, NOTEBOOKS[name], plan)
                finally:
                    context.close()
        finally:
            for name, content in originals.items():  # JupyterLab must not have saved them
                path = ROOT / NOTEBOOKS[name]
                if path.read_bytes() != content:
                    path.write_bytes(content)
                    print(f"warning: {path} was modified during the run; restored it")
    return combos


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0 all checks passed, 1 some failed, 2 tools missing."""
    args = parse_args(argv)
    missing = _missing_tools(args.chromium)
    if missing:
        print("ui-check needs:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    started = time.monotonic()
    print(
        f"ui-check: {', '.join(args.notebooks)} x {', '.join(args.themes)} x "
        f"{', '.join(map(str, args.widths))} px",
        flush=True,
    )
    combos = run(args)
    report = [
        {
            "notebook": c.notebook,
            "theme": c.theme,
            "width": c.width,
            "checks": c.checks,
            "failures": c.failures,
            "widest_output_px": c.output_width,
            "fixes_seen": c.findings,
            "screenshots": str(c.folder),
        }
        for c in combos
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    for combo in combos:
        for failure in combo.failures:
            print(f"FAIL {combo.notebook} {combo.theme} {combo.width}px: {failure}")
    print(f"\n{summary_table(combos)}\n")
    print(
        f"screenshots: {shown_path(args.out)}/<notebook>/<theme>-<width>/ "
        "(full.png: the whole notebook; cell-NN.png: the output of code cell NN)"
    )
    print(
        f"report: {shown_path(args.out / 'report.json')}; took {time.monotonic() - started:.0f} s"
    )
    return 1 if any(c.failures for c in combos) else 0


if __name__ == "__main__":
    sys.exit(main())
