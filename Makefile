# Two commands for a fresh machine (see README):
#   make quickstart   venv + install + run the main job on the bundled photos (worker processes, no Ray)
#   make test         venv + install + the default test suite
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
STAMP := $(VENV)/.mmpipe-installed

.PHONY: quickstart test install clean

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)" $(if $(TORCH_INDEX_URL),--index-url "$(TORCH_INDEX_URL)")
	$(BIN)/python -m pip install --quiet -e ".[test]" -c $(LOCK)
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/mmpipe run examples/quickstart.yaml
	$(BIN)/mmpipe status output/quickstart

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

clean:
	rm -rf output bench/out
