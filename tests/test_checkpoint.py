"""Checkpoint and resume: the server's optimizer state leaves through `Client.optimizer_state` and
comes back through `load_optimizer_state`, and `phub launch --max-restarts` starts a failed job
again. A job resumed from a checkpoint, or killed and restarted, ends with exactly the weights of
one that ran through (workers/exchange_worker.py: known gradients per step, so runs are
deterministic)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import phub
from conftest import WORKER
from test_exchange import SIZES, aggregate
from workers.exchange_worker import initial

STEPS, WORKERS = 4, 2
NAG = phub.NAG(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=1.0 / WORKERS)


def momentum_oracle(i, size, steps):
    w, mom = initial(size, i).astype(np.float64), np.zeros(size)
    for step in range(1, steps + 1):
        g = NAG.rescale_grad * aggregate(WORKERS, step, i, size) + NAG.wd * w
        mom = NAG.momentum * mom + g
        w = w - NAG.learning_rate * (g + NAG.momentum * mom)
    return mom


@pytest.mark.parametrize("transport", ["tcp", "soft-verbs"])
def test_a_job_resumed_from_its_checkpoint_ends_as_if_it_had_run_through(run_exchange, tmp_path, transport):
    through = run_exchange(WORKERS, SIZES, STEPS, NAG, transport=transport)
    checkpoint = str(tmp_path / "checkpoint.npz")
    run_exchange(WORKERS, SIZES, 2, NAG, worker_params={"checkpoint": checkpoint}, transport=transport)  # to step 2
    with np.load(checkpoint) as saved:
        assert int(saved["step"]) == 2
        for i, shape in enumerate(SIZES):  # the server's momentum after two rounds, out of the server
            want = momentum_oracle(i, int(np.prod(shape)), 2)
            assert np.max(np.abs(saved[f"m{i}"] - want) / np.maximum(1.0, np.abs(want))) <= 1e-6, i
    resumed = run_exchange(WORKERS, SIZES, STEPS, NAG, worker_params={"checkpoint": checkpoint}, transport=transport)
    for rank in range(WORKERS):
        for i in range(len(SIZES)):
            assert np.array_equal(resumed[rank][f"final{i}"], through[rank][f"final{i}"]), (rank, i)


def test_a_killed_worker_is_restarted_and_the_job_ends_as_if_uninterrupted(run_exchange, tmp_path):
    through = run_exchange(WORKERS, SIZES, STEPS, NAG)
    out = tmp_path / "restarted"
    out.mkdir()
    params = {"sizes": SIZES, "steps": STEPS, "optimizer": NAG.to_dict(), "out_dir": str(out),
              "checkpoint": str(out / "checkpoint.npz"), "die": {"rank": 1, "step": 2, "marker": str(out / "died")}}
    env = dict(os.environ, PHUB_TEST=json.dumps(params))
    argv = [sys.executable, "-m", "phub", "launch", "-n", str(WORKERS), "--timeout", "30"]
    once = subprocess.run(argv + ["--", sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=120)
    assert once.returncode != 0 and "rank 1" in once.stderr, once.stderr[-2000:]  # no restarts: fails naming it
    os.remove(out / "checkpoint.npz")
    os.remove(out / "died")
    run = subprocess.run(argv + ["--max-restarts", "1", "--", sys.executable, WORKER], env=env, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "restarting the job (1 of 1)" in run.stderr and os.path.exists(out / "died")
    for rank in range(WORKERS):
        with np.load(out / f"rank{rank}.npz") as saved:
            for i in range(len(SIZES)):
                assert np.array_equal(saved[f"final{i}"], through[rank][f"final{i}"]), (rank, i)
