# kiln developer commands. Each target sets up the virtual environment first,
# so `make demo` and `make test` work on a fresh machine.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DATA ?= build/demo-data
STAMP := $(VENV)/.kiln-installed

PEERS_STAMP := $(VENV)/.kiln-peers-installed

.PHONY: venv demo demo-detection test lint bench bench-listing bench-peers clean

venv: $(STAMP)

# Reinstall when the dependencies change.
$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[pipeline,gcp,aws,dev]"
	touch $(STAMP)

demo: venv
	$(BIN)/kiln demo-data $(DEMO_DATA)
	$(BIN)/kiln build --config configs/demo.yaml

# The detection demo: boxes, masks and keypoints (docs/detection-sources.md).
demo-detection: venv
	$(BIN)/kiln demo-data build/demo-detection --targets
	$(BIN)/kiln build --config configs/demo-detection.yaml

# The whole suite, the checks below included (tests/test_code_quality.py,
# test_security.py, test_architecture.py).
test: venv
	$(BIN)/python -m pytest

# The static checks alone, quicker while working: the linter, the type checker
# and the import layering (all configured in pyproject.toml and .importlinter).
lint: venv
	$(BIN)/python -m ruff check src tests benchmarks
	$(BIN)/python -m ruff format --check src tests benchmarks
	$(BIN)/python -m mypy
	$(BIN)/lint-imports --no-cache .importlinter

# The loaders the reader is measured against, for the benchmarks only.
$(PEERS_STAMP): $(STAMP) benchmarks/requirements-peers.txt
	$(BIN)/python -m pip install --quiet -r benchmarks/requirements-peers.txt
	touch $(PEERS_STAMP)

bench: venv $(PEERS_STAMP)
	$(BIN)/python -m benchmarks.run

# Only the section of BENCHMARKS.md with the reader against Grain and DALI.
bench-peers: venv $(PEERS_STAMP)
	$(BIN)/python -m benchmarks.peers_bench

# Only the listing sections of BENCHMARKS.md (bench measures the manifests' too;
# the image folder's, local and on a GCS emulator, only this target).
bench-listing: venv
	$(BIN)/python -m benchmarks.listing_bench
	$(BIN)/python -m benchmarks.folder_listing_bench

clean:
	rm -rf build $(VENV) src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
