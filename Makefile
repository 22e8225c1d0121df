# `make paper` runs the main job (the local emulated reproduction); `make test` runs the tests.
# Both bootstrap .venv first, so they work on a fresh clone.
#   make paper CONFIG=config/quick.yaml     the CI-sized grid (minutes instead of hours)
#   make paper NETWORK=loopback             without root: unshaped loopback instead of the rack
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
	$(VENV)/bin/snakemake --profile profiles/local $(if $(CONFIG),--configfile $(CONFIG)) \
		$(if $(NETWORK),--config network=$(NETWORK))

clean:
	rm -rf $(VENV) build *.egg-info phub/*.so
