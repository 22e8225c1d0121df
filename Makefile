# `make paper` runs the main job (the local emulated reproduction); `make test` runs the tests.
# Both bootstrap .venv first, so they work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test paper clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py phub/_kernels.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q

paper: venv
	@echo "make paper: the reproduction pipeline has not landed yet (see README.md, Status)." >&2
	@exit 2

clean:
	rm -rf $(VENV) build *.egg-info phub/*.so
