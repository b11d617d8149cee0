"""The browser side of ui-check: open a notebook in the private JupyterLab, run it from the
command palette while heights.js samples the progress outputs, then for every theme and
width take screenshots and probe the page (probe.js) for tools/ui/checks.py to judge."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checks import Combo, judge, judge_heights, magic_name
from .lab import THEMES, LabServer

HERE = Path(__file__).resolve().parent
WINDOW_HEIGHT = 1000
MAX_SCREENSHOT_HEIGHT = 16000  # Chromium draws taller pages, but the files get unwieldy
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
WATCHED_MAGICS = ("fit", "fine_tune")  # outputs whose height is sampled while they run


@dataclass(frozen=True)
class Plan:
    """What one notebook run is checked for: themes, widths, where the pictures go."""

    themes: tuple[str, ...]
    widths: tuple[int, ...]
    out: Path
    timeout_s: int
    min_contrast: float


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


_FILE_BROWSER = """() => {
  const app = window.jupyterapp;
  const notebook = app.shell.currentWidget.id;
  app.shell.activateById("filebrowser");
  app.shell.activateById(notebook);
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


def _show_at(page: Any, width: int, height: int = WINDOW_HEIGHT) -> None:
    """The window at this size with the file browser open beside the notebook (what
    takes a narrow window's room)."""
    page.evaluate(_FILE_BROWSER)
    page.set_viewport_size({"width": width, "height": height})
    _settle(page)


def _capture(page: Any, combo: Combo, probe: str, min_contrast: float) -> None:
    """Full-notebook and per-output screenshots, then the checks, at the combo's size."""
    combo.folder.mkdir(parents=True, exist_ok=True)
    _show_at(page, combo.width)
    extra = page.evaluate(_SCROLL_EXTRA)
    _show_at(page, combo.width, min(WINDOW_HEIGHT + max(extra, 0) + 40, MAX_SCREENSHOT_HEIGHT))
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


def _watched_sources(page: Any) -> dict[str, str]:
    """Cell index -> source of the cells whose output height heights.js samples."""
    sources = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".map((c) => c.model.type === 'code' ? c.model.sharedModel.getSource() : '')"
    )
    return {
        str(i): source for i, source in enumerate(sources) if magic_name(source) in WATCHED_MAGICS
    }


def check_notebook(context: Any, lab: LabServer, name: str, path: str, plan: Plan) -> list[Combo]:
    """Open, clear and run one notebook at the narrowest width while its progress heights
    are sampled, then check it in every theme and width."""
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.set_viewport_size({"width": max(plan.widths), "height": WINDOW_HEIGHT})
    page.goto(lab.notebook_url(path))
    page.wait_for_function(_NOTEBOOK_OPEN)
    page.evaluate(_WAIT_READY)
    page.wait_for_function(f"() => ({_STATE})().kernel === 'idle'")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    run = Combo(name, f"{plan.themes[0]} run", min(plan.widths), plan.out / name / "run")
    _show_at(page, run.width)
    watched = _watched_sources(page)
    page.evaluate((HERE / "heights.js").read_text(), list(watched))
    started = time.monotonic()
    _run_all_from_palette(page)
    state = _wait_until_run(page, plan.timeout_s)
    records = page.evaluate("() => window.tmHeights.stop()")
    run.folder.mkdir(parents=True, exist_ok=True)
    (run.folder / "heights.json").write_text(json.dumps(records, indent=1))
    judge_heights(records, watched, run)
    print(
        f"  {name}: ran {state['ran']}/{state['total']} code cells in "
        f"{time.monotonic() - started:.0f} s (kernel {state['kernel']}); progress heights: "
        + "; ".join(
            f"cell {i} {r['samples']} samples, heights {[round(h) for _, h in r['heights']]}"
            for i, r in records.items()
        ),
        flush=True,
    )
    combos = [run]
    probe = (HERE / "probe.js").read_text()
    for theme in plan.themes:
        _set_theme(page, theme)
        for width in plan.widths:
            combo = Combo(name, theme, width, plan.out / name / f"{theme}-{width}")
            _capture(page, combo, probe, plan.min_contrast)
            combos.append(combo)
            print(
                f"  {name} {theme} {width}: {len(combo.failures)} of {combo.checks} checks "
                f"failed; widest output {combo.output_width:.0f} px, {combo.findings} fixes",
                flush=True,
            )
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
    page.close()
    return combos
