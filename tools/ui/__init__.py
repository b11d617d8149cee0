"""The parts of ``make ui-check`` (tools/ui_check.py): the private JupyterLab (lab), the
browser that runs and measures a notebook (browser, probe.js, heights.js) and the
judgement of what it measured (checks), which the unit tests feed by hand."""
