# Developer entry points. Everything runs from the project's own venv (.venv), built with
# the standard library's venv and pip; TORCH_HOME points into build/ so that nothing is
# ever downloaded into the user's ~/.cache.

PYTHON := .venv/bin/python
VENV_STAMP := .venv/.installed
PYTEST_ARGS ?=
LINT_PATHS := $(wildcard src tests bench tools examples)

export TORCH_HOME := $(CURDIR)/build/torch_home

.PHONY: venv demo test lint bench

venv: $(VENV_STAMP)

$(PYTHON):
	python3 -m venv .venv

# Reinstall whenever pyproject.toml (and so the dependencies) changes.
$(VENV_STAMP): pyproject.toml | $(PYTHON)
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test,demo]'
	touch $@

demo: $(VENV_STAMP)
	$(PYTHON) tools/run_notebook.py examples/quickstart.ipynb --out build/quickstart.ipynb

test: $(VENV_STAMP)
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

lint: $(VENV_STAMP)
	.venv/bin/ruff check $(LINT_PATHS)

bench: $(VENV_STAMP)
	$(PYTHON) bench/surgery.py
