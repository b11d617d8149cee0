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
* text in magic outputs keeps a minimum contrast against the background it sits on.

Each notebook runs once; themes and widths are then applied to the live page, as a user
would switch them. Exit status 1 when any check fails, 2 when the tools are missing.

Usage: python tools/ui_check.py [--notebooks quickstart,all_magics] [--themes light,dark]
                                [--widths 1400,900] [--out build/ui]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROBE_JS = Path(__file__).resolve().parent / "ui" / "probe.js"
NOTEBOOKS = {"quickstart": "examples/quickstart.ipynb", "all_magics": "examples/all_magics.ipynb"}
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
DEFAULT_WIDTHS = (1400, 900)
WINDOW_HEIGHT = 1000
MAX_SCREENSHOT_HEIGHT = 16000  # Chromium draws taller pages, but the files get unwieldy
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# Magics that print nothing on success, so a missing output is no finding.
SILENT_MAGICS = frozenset({"load_ext", "reload_ext", "unload_ext", "config", "matplotlib"})
ERROR_LINE = re.compile(r"^(Traceback \(most recent call last\)|\w*(Error|Exception):)", re.M)


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


# -- pure checks ---------------------------------------------------------------------------


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
            for lines in output["pres"]:
                wrapped = wrapped_lines(lines)
                combo.check(
                    not wrapped,
                    f"{where}: {len(wrapped)} of {len(lines)} lines wrap, "
                    f"e.g. {_snippet(wrapped[0]) if wrapped else ''!r}",
                )
            for drawn in output.get("tables", []):
                outside = hidden_keys(drawn)
                combo.check(
                    not outside,
                    f"{where}: key columns {', '.join(outside)} of table "
                    f"{_snippet(drawn['title'], 40)!r} are right of the visible output "
                    f"({drawn['visibleRight']:.0f} px)",
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
            _relative(c.folder),
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


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# -- JupyterLab ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_settings(settings_dir: Path, theme: str) -> None:
    """User settings for a reproducible page: the theme, every cell in the DOM, no saving,
    no news or update checks (nothing may reach the network)."""
    settings = {
        "apputils-extension/themes": {"theme": THEMES[theme]},
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        "notebook-extension/tracker": {"windowingMode": "none"},
        "docmanager-extension/plugin": {"autosave": False},
    }
    for name, values in settings.items():
        path = settings_dir / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _write_kernelspec(data_dir: Path) -> None:
    """``python3`` = this interpreter (the project venv); PYTHONPATH comes from the server."""
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (torchmagic ui-check)",
        "language": "python",
    }
    folder = data_dir / "kernels" / "python3"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec))


@dataclass(frozen=True)
class LabServer:
    """Where the private JupyterLab listens and the token that opens it."""

    url: str
    token: str

    def notebook_url(self, path: str) -> str:
        """A fresh workspace (``reset``) showing just this notebook."""
        return f"{self.url}/lab/tree/{path}?token={self.token}&reset"


@contextmanager
def jupyterlab(scratch: Path, theme: str, log: Path) -> Iterator[LabServer]:
    """A private JupyterLab serving the repository, as long as the ``with`` lasts."""
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ)
    for name in ("config", "data", "runtime", "settings", "workspaces", "checkpoints"):
        (scratch / name).mkdir()
    env.update(
        JUPYTER_CONFIG_DIR=str(scratch / "config"),
        JUPYTER_DATA_DIR=str(scratch / "data"),
        JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(scratch / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"),
        JUPYTER_PLATFORM_DIRS="1",
        JUPYTER_PREFER_ENV_PATH="0",  # our kernelspec, not the venv's own python3
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])),
        TORCH_HOME=env.get("TORCH_HOME", str(ROOT / "build" / "torch_home")),
    )
    _write_settings(scratch / "settings", theme)
    _write_kernelspec(scratch / "data")
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={ROOT}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--FileCheckpoints.root_dir={scratch / 'checkpoints'}",  # no .ipynb_checkpoints/ here
        "--LabApp.extension_manager=readonly",
        "--ServerApp.terminals_enabled=False",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers run as root
        command.append("--allow-root")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as log_file:
        server = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            lab = LabServer(f"http://127.0.0.1:{port}", token)
            _wait_for_server(server, f"{lab.url}/api/status?token={token}", log)
            yield lab
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


def _wait_for_server(server: subprocess.Popen, url: str, log: Path, limit_s: int = 180) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({server.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    raise RuntimeError(f"JupyterLab did not answer within {limit_s} s; see {log}")


# -- the browser ---------------------------------------------------------------------------

_NOTEBOOK_OPEN = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  return !!(panel && panel.sessionContext && panel.content && panel.content.widgets);
}"""
_WAIT_READY = """async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  await panel.context.ready;
  await panel.sessionContext.ready;
}"""
_STATE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.widgets.filter((c) => c.model.type === "code");
  return {
    kernel: panel.sessionContext.session?.kernel?.status || "none",
    pending: cells.filter((c) => (c.node.querySelector(".jp-InputPrompt") || {})
      .textContent?.includes("*")).length,
    ran: cells.filter((c) => c.model.executionCount !== null).length,
    total: cells.length,
  };
}"""
_SCROLL_EXTRA = """() => {
  const notebook = window.jupyterapp.shell.currentWidget.content.node;
  const outer = notebook.querySelector(".jp-WindowedPanel-outer") || notebook;
  return outer.scrollHeight - outer.clientHeight;
}"""


def _run_all_from_palette(page: Any) -> None:
    """Run All Cells the way a user does: the command palette."""
    page.click(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    page.keyboard.press("Control+Shift+C")
    page.wait_for_selector(".lm-CommandPalette .lm-CommandPalette-input", state="visible")
    page.keyboard.type("Run All Cells")
    item = page.locator(".lm-CommandPalette-item", has_text=re.compile(r"^Run All Cells"))
    item.first.click()


def _wait_until_run(page: Any, timeout_s: int) -> dict[str, Any]:
    """Until the kernel is idle with nothing queued twice in a row (or the time is up)."""
    deadline, settled = time.monotonic() + timeout_s, 0
    page.wait_for_timeout(2000)  # let the first cell enter the queue
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE)
        settled = settled + 1 if state["kernel"] == "idle" and state["pending"] == 0 else 0
        if settled >= 2:
            return state
        page.wait_for_timeout(1000)
    return page.evaluate(_STATE)


def _set_theme(page: Any, theme: str) -> None:
    name = THEMES[theme]
    page.evaluate(
        "(n) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: n})", name
    )
    page.wait_for_function("(n) => document.body.dataset.jpThemeName === n", arg=name)
    page.wait_for_timeout(1500)  # the theme's CSS loads after the attribute flips


def _settle(page: Any) -> None:
    """Two animation frames after a resize, so Lumino's layout and reflow are done."""
    page.wait_for_timeout(800)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


_FILE_BROWSER = """() => {
  const app = window.jupyterapp;
  const notebook = app.shell.currentWidget.id;
  app.shell.activateById("filebrowser");
  app.shell.activateById(notebook);
}"""


def _capture(page: Any, combo: Combo, probe: str, min_contrast: float) -> None:
    """Full-notebook and per-output screenshots, then the checks, at the combo's size,
    with the file browser open beside the notebook (what takes a narrow window's room)."""
    combo.folder.mkdir(parents=True, exist_ok=True)
    page.evaluate(_FILE_BROWSER)
    page.set_viewport_size({"width": combo.width, "height": WINDOW_HEIGHT})
    _settle(page)
    extra = page.evaluate(_SCROLL_EXTRA)
    tall = min(WINDOW_HEIGHT + max(extra, 0) + 40, MAX_SCREENSHOT_HEIGHT)
    page.set_viewport_size({"width": combo.width, "height": tall})  # the whole notebook
    _settle(page)
    page.screenshot(path=str(combo.folder / "full.png"))
    data = page.evaluate(probe, {"maxText": 4000, "colours": min_contrast > 0})
    code_number = 0
    for cell in data["cells"]:
        if cell["type"] != "code" or not cell["source"].strip():
            continue
        code_number += 1
        if magic_name(cell["source"]) and any(o["present"] for o in cell["outputs"]):
            area = page.locator(f'[data-tm-cell="{cell["index"]}"] .jp-Cell-outputArea')
            area.screenshot(path=str(combo.folder / f"cell-{code_number:02d}.png"))
    (combo.folder / "page.json").write_text(json.dumps(data, indent=1))
    judge(data, combo, min_contrast)
    page.set_viewport_size({"width": combo.width, "height": WINDOW_HEIGHT})


def check_notebook(
    context: Any, lab: LabServer, name: str, args: argparse.Namespace, probe: str
) -> list[Combo]:
    """Open, clear and run one notebook, then check it in every theme and width."""
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.set_viewport_size({"width": max(args.widths), "height": WINDOW_HEIGHT})
    page.goto(lab.notebook_url(NOTEBOOKS[name]))
    page.wait_for_function(_NOTEBOOK_OPEN)
    page.evaluate(_WAIT_READY)
    page.wait_for_function(f"() => ({_STATE})().kernel === 'idle'")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    started = time.monotonic()
    _run_all_from_palette(page)
    state = _wait_until_run(page, args.timeout)
    print(
        f"  {name}: ran {state['ran']}/{state['total']} code cells in "
        f"{time.monotonic() - started:.0f} s (kernel {state['kernel']})",
        flush=True,
    )
    combos = []
    for theme in args.themes:
        _set_theme(page, theme)
        for width in args.widths:
            combo = Combo(name, theme, width, args.out / name / f"{theme}-{width}")
            _capture(page, combo, probe, args.min_contrast)
            combos.append(combo)
            print(
                f"  {name} {theme} {width}: {len(combo.failures)} of {combo.checks} checks failed",
                flush=True,
            )
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
    page.close()
    return combos


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

    probe = PROBE_JS.read_text()
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
                        combos += check_notebook(context, lab, name, args, probe)
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
        f"screenshots: {_relative(args.out)}/<notebook>/<theme>-<width>/ "
        "(full.png: the whole notebook; cell-NN.png: the output of code cell NN)"
    )
    print(f"report: {_relative(args.out / 'report.json')}; took {time.monotonic() - started:.0f} s")
    return 1 if any(c.failures for c in combos) else 0


if __name__ == "__main__":
    sys.exit(main())
