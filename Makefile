# Developer entry points. Everything runs from the project's own venv (.venv), built with
# the standard library's venv and pip; TORCH_HOME points into build/ so that nothing is
# ever downloaded into the user's ~/.cache.

PYTHON := .venv/bin/python
VENV_STAMP := .venv/.installed
PYTEST_ARGS ?=
# pytest-xdist workers, one per core of the two-core machines the suite is sized for; each
# test file runs whole in one worker (its tests keep their order). WORKERS=0 runs in-process.
WORKERS ?= 2
PYTEST := $(PYTHON) -m pytest -q -n $(WORKERS) --dist loadfile
LINT_PATHS := $(wildcard src tests bench tools examples)

# The floor-version venv of `make test-floor`: torch, torchvision and IPython pinned to the
# lowest versions pyproject.toml allows (read from it, so the floors have one source).
FLOOR_VENV := build/floor-venv
FLOOR_PYTHON ?= python3
FLOOR_PINS = $(shell $(FLOOR_PYTHON) -c "import re; print(' '.join(n + '==' + v for n, v in re.findall(r'\"(torch|torchvision|ipython)>=([^\"]+)\"', open('pyproject.toml').read())))")
# Where to get torch wheels for the floor venv. Empty: the default index, whose Linux torch
# wheels are CUDA builds (torch 2.3 alone is a 779 MB download, ~3 GB with its CUDA
# libraries). Set it to PyTorch's own CPU wheel index for ~200 MB.
TORCH_INDEX ?=

export TORCH_HOME := $(CURDIR)/build/torch_home

.PHONY: venv demo test test-slow test-all test-floor lint bench gpu-check ui-check pty-check fuzz

venv: $(VENV_STAMP)

$(PYTHON):
	python3 -m venv .venv

# Reinstall whenever pyproject.toml (and so the dependencies) changes.
$(VENV_STAMP): pyproject.toml | $(PYTHON)
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test,demo]'
	touch $@

# The README's first session on a generated folder of images (examples/own_data.ipynb) in a
# real kernel, echoed cell by cell, offline (a couple of minutes on two cores; the first run
# adds a few minutes of pretraining for the resnet18 stand-in, cached in build/weights).
demo: $(VENV_STAMP)
	$(PYTHON) tools/run_notebook.py examples/own_data.ipynb --out build/own_data.ipynb

# The fast tests: under five minutes on two cores. `make test-all` adds the slow ones
# (the quickstart in a kernel, whole-model sweeps, the undo property test at full size).
test: $(VENV_STAMP)
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# Only the slow ones: `.ci/run` runs `make test` (the README's command), then this.
test-slow: $(VENV_STAMP)
	$(PYTEST) -m slow $(PYTEST_ARGS)

test-all: $(VENV_STAMP)
	$(PYTEST) $(PYTEST_ARGS)

# The fast tests against the lowest supported torch/torchvision/IPython, in a venv of its
# own. Costly the first time (see TORCH_INDEX above); not part of .ci/run for that reason.
# numpy<2: the torch 2.3 wheels were built against numpy 1.
test-floor:
	$(FLOOR_PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/pip install -q --upgrade pip
	$(FLOOR_VENV)/bin/pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) \
		$(filter torch==% torchvision==%,$(FLOOR_PINS))
	$(FLOOR_VENV)/bin/pip install -q 'numpy<2' $(FLOOR_PINS) -e '.[test,demo]'
	$(FLOOR_VENV)/bin/python -c "import torch, torchvision, IPython; print('floor:', torch.__version__, torchvision.__version__, IPython.__version__)"
	$(FLOOR_VENV)/bin/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: $(VENV_STAMP)
	.venv/bin/ruff check $(LINT_PATHS)
	$(PYTHON) -m mypy src

bench: $(VENV_STAMP)
	$(PYTHON) bench/surgery.py

# The GPU checks in one table: the `gpu` tests and the GPU sections of bench/memory.py and
# bench/fit.py (about five minutes on one GPU). Without CUDA it says so and exits 0.
gpu-check: $(VENV_STAMP)
	$(PYTHON) tools/gpu_check.py

# A real-browser look at the notebooks (JupyterLab + headless Debian Chromium, light and dark,
# 1400 and 900 px: a ~450 px output with the file browser open; %tm doctor's fixes in view,
# numbers whole, %fit / %fine_tune heights sampled as they run), then pty-check; not part of
# `make test`. Installs jupyterlab, playwright and pyte into .venv and Debian's chromium when
# missing (never Playwright's own browser download).
UI_CHECK_ARGS ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ui-check: $(VENV_STAMP)
	$(PYTHON) -c "import jupyterlab, playwright" 2>/dev/null || .venv/bin/pip install -q 'jupyterlab>=4' 'playwright>=1.40'
	test -x /usr/bin/chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }
	$(PYTHON) tools/ui_check.py $(UI_CHECK_ARGS)
	$(MAKE) pty-check

# A torchmagic session typed into a real terminal IPython under a pty at 60, 80 and 100
# columns, emulated by pyte: no line wider than the terminal, nothing above %fine_tune
# erased, a refusal one line. Captures: build/ui/pty-<cols>.txt.
PTY_CHECK_ARGS ?=
pty-check: $(VENV_STAMP)
	$(PYTHON) -c "import pyte" 2>/dev/null || .venv/bin/pip install -q 'pyte>=0.8'
	$(PYTHON) tools/pty_check.py $(PTY_CHECK_ARGS)

# The magics fuzzer at length (the suite runs a few hundred examples): every line is one
# UsageError or a success, and a refusal changes nothing.
FUZZ_EXAMPLES ?= 5000
fuzz: $(VENV_STAMP)
	TORCHMAGIC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PYTHON) -m pytest -q tests/magics/test_fuzz.py
