import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import phub
from phub.errors import ProtocolError
from phub.launch import worker_env

WORKER = str(Path(__file__).parent / "workers" / "exchange_worker.py")


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
