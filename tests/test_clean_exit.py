"""How workers leave a job: a script that ends normally (with or without close()) has succeeded;
one that crashes or is killed fails the job, naming it; one that leaves while the others still
push fails it at once. Real `phub launch` runs (server and workers as processes) on loopback,
running workers/exit_worker.py, which trains a few steps and then ends as the test asks."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import phub

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(Path(__file__).parent / "workers" / "exit_worker.py")
BOUND = 30  # seconds within which a failed job must have ended


def worker_env(**extra):
    """The environment of a launched worker: this checkout's phub first on the import path."""
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **extra)


def launch(framework, ending, *command):
    env = worker_env(PHUB_TEST=json.dumps({"framework": framework, "ending": ending}))
    env.pop("MASTER_ADDR", None)
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "phub", "launch", "-n", "2", "--timeout", "60", "--",
                          *(command or (sys.executable, WORKER))], env=env, capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    return run, time.monotonic() - start


def needs(framework):
    if framework == "mxnet":
        pytest.importorskip("mxnet", reason="mxnet is not installed (pip install -e '.[test]')")
    elif framework.startswith("torch"):
        pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")


@pytest.mark.parametrize("framework, ending", [
    ("plain", "none"), ("plain", "close"), ("plain", "sys_exit"), ("plain", "in_flight"),
    ("mxnet", "none"), ("mxnet", "collected"),
    ("torch", "none"), ("torch", "collected"), ("torch_ddp", "none"),
])
def test_a_worker_that_ends_normally_leaves_the_job_cleanly(framework, ending):
    needs(framework)
    run, _ = launch(framework, ending)
    output = f"{run.stdout}\n{run.stderr}"
    assert run.returncode == 0, output
    assert "job 0 failed" not in run.stderr and "could not leave" not in run.stderr, output
    assert f"[rank 0] phub from {ROOT / 'phub'}" in run.stdout, "the workers did not run this checkout's phub"
    if ending == "collected":  # os._exit skipped the exit hook: the collected store said BYE
        assert "[rank 0] rank 0 collected, client closed: True" in run.stdout, output
        assert "[rank 1] rank 1 collected, client closed: True" in run.stdout, output


@pytest.mark.parametrize("framework", ["plain", "mxnet", "torch"])
def test_a_killed_worker_still_fails_the_job_naming_it(framework):
    needs(framework)
    run, elapsed = launch(framework, "kill")
    assert run.returncode != 0
    assert "worker 1 lost" in run.stderr or "phub launch: rank 1 exited with status -9" in run.stderr, run.stderr
    assert elapsed < BOUND + 30  # the start (imports) included


def test_a_crashing_worker_fails_the_job_naming_its_exception():
    run, elapsed = launch("plain", "raise")
    assert run.returncode != 0
    assert "ValueError: rank 1 fails on purpose" in run.stderr  # its own traceback
    # The exit hook told the server: the others' calls fail at once with the cause, not a lost link.
    assert "rank 1 gave up: rank 1 exited on an uncaught ValueError: rank 1 fails on purpose" in run.stderr, run.stderr
    assert elapsed < BOUND + 10


def test_a_worker_that_leaves_while_others_push_fails_the_job_at_once():
    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 2),), once=True, timeout=60)).start()
    try:
        clients = [None, None]

        def join(rank):
            clients[rank] = phub.connect(server.address, rank=rank, num_workers=2, timeout=60)
            clients[rank].init("w", np.zeros(3, np.float32))

        threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        clients[1].close()  # rank 1's work is done (it made no pushpull)
        start = time.monotonic()
        with pytest.raises(phub.JobFailed, match=r"worker 1 left the job \(it closed or exited\) while "
                                                 r"rank\(s\) \[0\] still push chunk 0 \(iteration 1\)"):
            clients[0].pushpull("w", np.ones(3, np.float32), timeout=50)
        assert time.monotonic() - start < 10, "it waited for the stall timeout instead"
        assert server.wait(timeout=BOUND) == 1
        clients[0].close()
    finally:
        server.stop()


def test_launch_runs_python_with_its_own_interpreter(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text("#!/bin/sh\necho 'the wrong python ran' >&2\nexit 3\n")
    (fake / "python").chmod(0o755)
    code = ("import sys, numpy, phub; kv = phub.connect(); w = numpy.zeros(3, numpy.float32); kv.init('w', w); "
            "kv.pushpull('w', numpy.ones(3, numpy.float32)); print('ran with', sys.executable)")  # no close()
    env = worker_env(PATH=f"{fake}{os.pathsep}/usr/bin{os.pathsep}/bin")
    run = subprocess.run([sys.executable, "-m", "phub", "launch", "-n", "2", "--", "python", "-c", code],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "the wrong python ran" not in run.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] ran with {sys.executable}" in run.stdout, run.stdout
    help_text = subprocess.run([sys.executable, "-m", "phub", "launch", "--help"], env=env, capture_output=True,
                               text=True, timeout=60, cwd=ROOT).stdout
    help_text = " ".join(help_text.split())  # argparse wraps it to the terminal's width
    assert "`python` or `python3` runs with this phub's own interpreter" in help_text, help_text
