"""Shared fixtures, and the markers that sort the tests by what they need.

Every test module gets one or more of these markers from what its code does (`needs_of`, read
from its source, so a new module is sorted without a list to keep):

* ``lab``: it imports the harness (experiments, analysis, the workflow's and the benchmarks'
  scripts) or runs it (`python -m experiments`, Snakemake). Without the harness installed these modules are not
  even collected, so ``pytest -m "not lab"`` runs with only the library installed.
* ``netns``: it needs root and network namespaces (it skips, saying why, without them).
* ``jobs``: it starts real processes (servers, workers, launchers, the CLI).
* ``library``: none of the above: the library in this process (protocol, aggregation, kernels).

With PHUB_REQUIRE_C=1 (``make test``, hence CI) a missing C extension stops the run instead of
letting the tests that need it skip.
"""
import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import phub
from phub.errors import ProtocolError
from phub.launching.launch import worker_env

WORKER = str(Path(__file__).parent / "workers" / "exchange_worker.py")
HARNESS = {"experiments", "analysis", "points", "run_shape", "tidy", "run_record", "check_network", "write_json"}
HARNESS_WORDS = ("-m experiments", "-m analysis", "snakemake", "Snakefile", "benchmarks")
NETNS_WORDS = ("geteuid", "netns")  # in names: os.geteuid(), needs_netns, run_in_netns
JOB_NAMES = {"subprocess", "multiprocessing", "Server", "start_workers", "run_exchange", "launch"}
C_EXTENSIONS = ("phub._fastpath", "phub._fastkernels")


def needs_of(source: str) -> set:
    """The markers of a test module (see the module docstring), from its source text."""
    tree = ast.parse(source)
    imported, names, strings = set(), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
            names |= {alias.name for alias in node.names}
        elif isinstance(node, (ast.Name, ast.Attribute, ast.arg)):  # ast.arg: a fixture asked for by name
            names.add(node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                      else node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append(node.value)
    text = " ".join(strings)  # an argv's items in a row: "-m", "experiments"
    needs = set()
    if imported & HARNESS or any(word in text for word in HARNESS_WORDS):
        needs.add("lab")
    if any(word in name for name in names for word in NETNS_WORDS) or "ip netns" in text:
        needs.add("netns")
    if (imported | names) & JOB_NAMES:
        needs.add("jobs")
    return needs or {"library"}


def _harness_installed() -> bool:
    try:
        return all(importlib.util.find_spec(name) is not None for name in ("experiments", "analysis"))
    except ImportError:
        return False


def _lab_modules() -> list:
    return [path.name for path in sorted(Path(__file__).parent.glob("test_*.py"))
            if "lab" in needs_of(path.read_text())]


# Without the harness, its tests are not collected (they would fail to import).
collect_ignore = [] if _harness_installed() else _lab_modules()


def pytest_configure(config):
    if os.environ.get("PHUB_REQUIRE_C") == "1":
        missing = [name for name in C_EXTENSIONS if importlib.util.find_spec(name) is None]
        if missing:
            raise pytest.UsageError(f"PHUB_REQUIRE_C=1 and the C extension(s) {', '.join(missing)} are not built "
                                    "(pip install -e . builds them; a C compiler is needed)")


_NEEDS = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path not in _NEEDS:
            _NEEDS[path] = needs_of(path.read_text())
        for marker in sorted(_NEEDS[path]):
            item.add_marker(marker)


def refused(call, *words):
    """Call `call`, which must raise ProtocolError with every one of `words` in its message."""
    with pytest.raises(ProtocolError) as info:
        call()
    for word in words:
        assert word in str(info.value), str(info.value)


def start_workers(server, num_workers, params, job_id=0, token="", timeout=60, stdout=None):
    """Start `num_workers` exchange workers (real processes) against `server`."""
    procs = []
    for rank in range(num_workers):
        env = dict(os.environ, PHUB_TEST=json.dumps(params),
                   **worker_env(server.address, rank, num_workers, job_id, token, timeout))
        procs.append(subprocess.Popen([sys.executable, WORKER], env=env, stdout=stdout or subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs, timeout=120):
    """Wait for every process; return their (exit status, stderr)."""
    results = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err = f"(killed after {timeout} s) {err}"
        results.append((proc.returncode, err))
    return results


@pytest.fixture
def run_exchange(tmp_path):
    """Run a whole job: server (in this process's children) + workers; return each rank's saved arrays."""
    servers = []

    def run(num_workers, sizes, steps, optimizer=None, cores=1, interfaces=("127.0.0.1",), slow=None,
            split_init=False, share=False, worker_params=None, **config):
        server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, num_workers),), cores=cores,
                                               interfaces=interfaces, once=True, timeout=60, **config)).start()
        servers.append(server)
        params = {"sizes": sizes, "steps": steps, "optimizer": optimizer and optimizer.to_dict(),
                  "out_dir": str(tmp_path), "slow": slow, "split_init": split_init, "share": share,
                  **(worker_params or {})}
        outcomes = finish(start_workers(server, num_workers, params))
        for rank, (code, err) in enumerate(outcomes):
            assert code == 0, f"rank {rank} failed:\n{err}"
        assert server.wait(timeout=30) == 0
        return [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(num_workers)]

    yield run
    for server in servers:
        server.stop()
