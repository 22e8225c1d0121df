"""The `phub` command as a user runs it, and the harness's `python -m experiments bench`."""
import json
import signal
import subprocess
import sys

import numpy as np

import phub

PHUB = [sys.executable, "-m", "phub"]
HARNESS = [sys.executable, "-m", "experiments"]


def run(*args, timeout=300, command=PHUB):
    return subprocess.run(command + list(args), capture_output=True, text=True, timeout=timeout)


def test_bench_exchange_resnet50_verifies():
    result = run("bench", "exchange", "--system", "phub", "--model", "resnet50", "--workers", "2",
                 "--iterations", "5", "--verify", "--json", command=HARNESS)
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["verified"] is True
    assert row["system"] == "phub" and row["model"] == "resnet50" and row["workers"] == 2
    assert row["bytes_per_worker"] == 102197944  # 4 x 25,549,486 parameters
    assert row["seconds_per_iteration"] > 0 and abs(row["exchanges_per_s"] * row["seconds_per_iteration"] - 2) < 1e-9


def test_bench_rejects_unknown_model_and_system():
    result = run("bench", "exchange", "--model", "resnet51", command=HARNESS)
    assert result.returncode == 2 and "unknown model 'resnet51'" in result.stderr
    result = run("bench", "exchange", "--system", "nccl", command=HARNESS)
    assert result.returncode == 2 and "--system nccl" in result.stderr


def test_selftest():
    result = run("selftest")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"selftest": "ok", "fast_kernels": True, "verified": True}


def test_the_selftests_oracle_is_the_closed_form():
    from phub.launching import selftest

    size, workers, lr = 50, selftest.WORKERS, selftest.LEARNING_RATE
    for step in range(selftest.STEPS):
        # after steps 0..k every element i moved by lr * (1 + ... + (k+1)) * (1 + ... + W) * (i mod 7)
        moved = lr * (step + 1) * (step + 2) / 2 * workers * (workers + 1) / 2 * (np.arange(size) % 7)
        np.testing.assert_array_equal(selftest.expected_weights(size, step), (1 - moved).astype(np.float32))


def test_standalone_server_serves_two_jobs_and_stops_on_sigterm():
    proc = subprocess.Popen(PHUB + ["server", "--cores", "2", "--job", "1:1:a", "--job", "2:1:b"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready" and len(ready["endpoints"]) == 2
        clients = [phub.connect(ready["address"], rank=0, num_workers=1, job_id=job, token=token, timeout=10)
                   for job, token in ((1, "a"), (2, "b"))]
        arrays = [np.full(10000, 1.0, np.float32), np.full(10000, 100.0, np.float32)]
        for kv, w in zip(clients, arrays):
            kv.init("w", w)
            kv.set_optimizer(phub.SGD(learning_rate=0.5))
        for step in range(3):
            for kv, w in zip(clients, arrays):  # the same key name in two jobs stays separate
                kv.pushpull("w", np.full(10000, 2.0, np.float32), out=w)
        assert np.all(arrays[0] == 1.0 - 3) and np.all(arrays[1] == 100.0 - 3)
        for kv in clients:
            kv.close()
        assert proc.poll() is None  # without --once, it keeps serving
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
        assert not any(_alive(pid) for pid in ready["pids"]), "a core process outlived the server"
    finally:
        proc.kill()
        proc.wait()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_server_rejects_bad_config():
    result = run("server", "--interfaces", "not-an-ip")
    assert result.returncode == 2 and "not-an-ip" in result.stderr
    result = run("server", "--job", "x")
    assert result.returncode == 2 and "ID:WORKERS" in result.stderr
