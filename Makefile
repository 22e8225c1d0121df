# `make paper` runs the main job (the local emulated reproduction); `make test` runs the tests.
# Both bootstrap .venv first, so they work on a fresh clone.
#   make paper CONFIG=config/quick.yaml     the CI-sized grid (minutes instead of hours)
#   make paper NETWORK=loopback             without root: unshaped loopback instead of the rack
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

QUICK := results/quick

.PHONY: venv test paper test-slurm check-quick clean

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

# SLURM: a one-node cluster on this machine (Debian packages, as root), a few quick-grid points
# submitted through profiles/cluster, checked with sacct, the daemons stopped (a few minutes).
test-slurm: venv
	VENV=$(VENV) workflow/scripts/test_slurm.sh

# The quick grid end to end on the local profile (as root: the emulated rack), then a check that
# every figure and every claim row of the report is there, and that the HTML report builds.
check-quick: venv
	$(VENV)/bin/snakemake --profile profiles/local --configfile config/quick.yaml
	$(PY) -m analysis check --results $(QUICK)/points --figures $(QUICK)/figures --report $(QUICK)/report.md \
		--min-measured 20
	$(VENV)/bin/snakemake --profile profiles/local --configfile config/quick.yaml --report $(QUICK)/report.html
	test -s $(QUICK)/report.html

clean:
	rm -rf $(VENV) build *.egg-info phub/*.so
