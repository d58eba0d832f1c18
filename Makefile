# Two entry points: `make demo` (the main job) and `make test`.
# Each creates or reuses .venv and installs what it needs: the demo only the runtime
# dependencies, the tests also the test, lint and benchmark tools.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-properties test-asyncio-loop lint bench clean

$(RUNTIME): pyproject.toml setup.py porter_mesh/core/_speedups.c
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

# Three workers, one test file each at a time (a file's module fixtures stay in one
# process): most tests wait on real processes and sockets, so three share two cores well.
TEST_WORKERS ?= 3

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not slow and not browser"

# The long fault runs and the browser suite (CI's second step). pytest's exit 5 means
# nothing was collected, which is not a failure here.
test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "slow or browser" || test $$? -eq 5

# Every Hypothesis property again, at its full count of examples (make test runs a
# quick pass: tests/fuzzing.py). They only compute, so two workers share two cores.
test-properties: $(STAMP)
	PORTER_MESH_FUZZ_SCALE=$${PORTER_MESH_FUZZ_SCALE:-1} $(PY) -m pytest -q -p no:cacheprovider \
		-n 2 -m property

# The node's own tests again on asyncio's loop (the default is uvloop's where it is
# installed): what runs where uvloop is absent or PORTER_MESH_LOOP=asyncio asks for it.
LOOP_TESTS := $(addprefix tests/integration/,test_node_mesh.py test_node_delivery.py \
	test_node_receive.py test_node_hostile.py test_crash_delivery.py test_idle.py \
	test_timer.py test_sync_facade.py test_recontact.py test_cli_request.py \
	test_knowledge_mesh.py)

test-asyncio-loop: $(STAMP)
	PORTER_MESH_LOOP=asyncio $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) \
		--dist loadfile -m "not slow and not browser" $(LOOP_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check porter_mesh agents bench tests
	$(VENV)/bin/mypy --strict porter_mesh agents

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info
