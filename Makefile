# Two commands for a fresh machine (see README):
#   make quickstart   venv + install + run the main job on the bundled photos on a local Ray
#   make test         venv + install + the default test suite
PYTHON ?= python3
VENV ?= .venv
# CPU build of torch; on a GPU machine use e.g. TORCH=torch==2.13.0 with the CUDA index.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.mmpipe-installed

.PHONY: quickstart test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/mmpipe run examples/quickstart.yaml
	$(BIN)/mmpipe status output/quickstart

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

clean:
	rm -rf output bench/out
