# Two entry points: `make demo` (the main job) and `make test`.
# Each creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m porter_mesh.cli.main demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not browser"

# The long fault runs and the browser suite (CI's second step). pytest's exit 5 means
# nothing was collected, which is not a failure here.
test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "slow or browser" || test $$? -eq 5

lint: $(STAMP)
	$(VENV)/bin/ruff check porter_mesh agents bench tests
	$(VENV)/bin/mypy --strict porter_mesh

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info
