# make demo: fresh clone → .venv → builds, runs and benches the demo models.
# make test: the same set-up, then the whole test suite (GPU tests skip without a GPU).

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.kiln-installed
# Every other package is pinned by constraints.txt: a fresh clone installs exactly what CI tested.
PIN     = -c constraints.txt
# The CPU build of torch (a local wheel on our machines); a GPU machine keeps the torch it has.
TORCH  ?= torch==2.13.0

.PHONY: demo test conformance clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q $(PIN) -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kiln demo

test: $(STAMP)
	$(VENV)/bin/ruff check --no-cache .
	$(PY) -m pytest -q -p no:cacheprovider; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

conformance: $(STAMP)
	$(VENV)/bin/kiln conformance --out docs/conformance.md --category node --category simple --category pytorch-converted --category pytorch-operator

clean:
	rm -rf $(VENV) build dist src/*.egg-info
