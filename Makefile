# `make paper` runs the main job (the local emulated reproduction); `make test` runs the tests.
# Both bootstrap .venv first, so they work on a fresh clone.
#   make paper CONFIG=config/quick.yaml     the CI-sized grid (minutes instead of hours)
#   make paper NETWORK=loopback             without root: unshaped loopback instead of the rack
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

QUICK := results/quick

.PHONY: venv pyverbs test paper publish test-slurm check-quick api-docs clean

venv: $(STAMP)

# The library (phub) and, beside it, the harness (experiments/ and analysis/, packaged by lab/), both editable.
$(STAMP): pyproject.toml setup.py phub/_fastkernels.c phub/_fastkernels.h phub/_fastpath.c \
		phub/_fastpath_rounds.h phub/_fastpath_direct.h phub/_fastpath_send.h phub/_fastpath_racks.h \
		phub/_fastpath_contract.h lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[test]' -e ./lab
	touch $(STAMP)

# pyverbs (rdma-core's Python bindings, for the verbs transport) is the distribution's package,
# linked into the venv alone. Best effort: without it the tests that need it skip, saying why.
SYSTEM_PYVERBS := /usr/lib/python3/dist-packages/pyverbs
pyverbs: venv
	@if ! $(PY) -c 'import pyverbs' 2>/dev/null; then \
	  if [ ! -d $(SYSTEM_PYVERBS) ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    timeout 300 apt-get install -y -qq python3-pyverbs >/dev/null 2>&1 || echo "pyverbs: apt-get install python3-pyverbs failed"; fi; \
	  if [ -d $(SYSTEM_PYVERBS) ]; then \
	    mkdir -p $(VENV)/system-pyverbs && ln -sfn $(SYSTEM_PYVERBS) $(VENV)/system-pyverbs/pyverbs && \
	    $(PY) -c 'import os, sysconfig; open(os.path.join(sysconfig.get_paths()["purelib"], "system-pyverbs.pth"), "w").write(os.path.abspath("$(VENV)/system-pyverbs") + "\n")'; fi; \
	fi
	@$(PY) -c 'import pyverbs.device' 2>/dev/null && echo "pyverbs: importable" || echo "pyverbs: not importable (the tests that need it skip, saying why)"

test: venv pyverbs
	PHUB_REQUIRE_C=1 $(PY) -m pytest -q

# Timed from before the venv step; RESULTS/run.json records the time and the machine.
paper:
	@started=$$(date +%s.%N); \
	$(MAKE) --no-print-directory venv && \
	$(VENV)/bin/snakemake --profile profiles/local $(if $(CONFIG),--configfile $(CONFIG)) \
		$(if $(NETWORK),--config network=$(NETWORK)); status=$$?; \
	$(PY) workflow/scripts/run_record.py --started $$started --status $$status $(if $(CONFIG),--configfile $(CONFIG)); \
	exit $$status

# Copy the last full run (results/) to docs/results/, the run the README's status and report
# link to: its report, the model's section, figures with their captions, tidy per-point CSVs
# and run.json.
publish:
	test -s results/run.json && test -s results/report.md
	rm -rf docs/results/points docs/results/figures && mkdir -p docs/results/points
	cp results/report.md results/run.json results/model.md docs/results/
	cp -r results/figures docs/results/figures
	cd results/points && find . -name '*.csv' -exec cp --parents {} ../../docs/results/points/ \;

# SLURM: a one-node cluster on this machine (Debian packages, as root), a few quick-grid points
# submitted through profiles/cluster, checked with sacct, the daemons stopped (a few minutes).
test-slurm: venv
	VENV=$(VENV) workflow/scripts/test_slurm.sh

# The quick grid end to end on the local profile (as root: the emulated rack), then a check that
# every figure and every claim row of the report is there, and that the HTML report builds.
check-quick: venv
	$(VENV)/bin/snakemake --profile profiles/local --configfile config/quick.yaml
	$(PY) -m analysis check --results $(QUICK)/points --figures $(QUICK)/figures --report $(QUICK)/report.md \
		--min-measured 15
	$(VENV)/bin/snakemake --profile profiles/local --configfile config/quick.yaml --report $(QUICK)/report.html
	test -s $(QUICK)/report.html

# The API reference (HTML, from the docstrings) into build/api/; strict: a pdoc warning fails it.
# tests/test_docs.py builds it too, so CI's `make test` checks it.
api-docs: venv
	$(PY) docs/build_api.py build/api

clean:
	rm -rf $(VENV) build *.egg-info phub/*.so
