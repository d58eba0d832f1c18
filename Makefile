# Two entry points: `make demo` (the main job) and `make test`.
# Each creates or reuses .venv and installs what it needs: the demo only the runtime
# dependencies, the tests also the test, lint and benchmark tools.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(RUNTIME): pyproject.toml
	@test -x $(PY) || { echo "== creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "== installing porter-mesh and its runtime dependencies into $(VENV)"
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -e .
	@touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	@echo "== installing the test, lint and benchmark tools into $(VENV)"
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -e '.[dev,bench]'
	@touch $(STAMP)

demo: $(RUNTIME)
	$(PY) -m porter_mesh.cli.main demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check porter_mesh agents bench tests
	$(VENV)/bin/mypy --strict porter_mesh

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info
