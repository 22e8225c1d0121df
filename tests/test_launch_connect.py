"""Starting a job by hand as on several machines: a worker started before its server waits for
it (within its connect timeout), a server started alone serves one job's successive runs, and
`phub launch` gives every worker torch's variables and says at the end what PHub carried."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ELEMENTS, ROUNDS = 1000, 3

# A worker: says it is about to connect, then pushes ELEMENTS ones ROUNDS times and checks the sum.
WORKER = f"""
import os, sys, numpy as np, phub
print("connecting", flush=True)
client = phub.connect()
print(json.dumps({{name: os.environ.get(name) for name in
                  ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}}), flush=True)
ones = np.ones({ELEMENTS}, np.float32)
client.init(["w"], [ones])
for _ in range({ROUNDS}):
    out = client.pushpull("w", np.ones({ELEMENTS}, np.float32))
    assert np.allclose(out, client.num_workers), out[:4]
client.close()
""".replace("import os, sys", "import json, os, sys")


def env(**extra):
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **extra)


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def worker(port: int, timeout: float = 60.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(PHUB_SERVER=f"127.0.0.1:{port}", PHUB_RANK="0", PHUB_NUM_WORKERS="1",
                                    PHUB_TIMEOUT=str(timeout)))


def test_a_worker_started_first_waits_for_the_server_which_then_serves_the_next_run_too():
    port = unused_port()
    early = worker(port)
    assert early.stdout.readline().strip() == "connecting"  # it is connecting before any server listens
    server = subprocess.Popen([sys.executable, "-m", "phub", "server", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        out, err = early.communicate(timeout=120)
        assert early.returncode == 0, err
        again = worker(port)  # the same job id, a new run, the same server
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        assert server.poll() is None  # it serves on
    finally:
        server.terminate()
        _, log = server.communicate(timeout=30)
    carried = 2 * ELEMENTS * 4 * ROUNDS  # one worker pushed and pulled ELEMENTS floats ROUNDS times
    said = [line for line in log.splitlines() if "ended cleanly" in line]
    assert len(said) == 2 and all(f"{carried} bytes" in line and f"{ROUNDS} round(s)" in line for line in said), log
    assert "a new run starts" in log


def test_a_worker_whose_server_never_comes_up_names_its_address_and_timeout():
    port = unused_port()
    start = time.monotonic()
    lonely = worker(port, timeout=2.0)
    _, err = lonely.communicate(timeout=60)
    assert lonely.returncode != 0
    assert f"127.0.0.1:{port}" in err and "refused for 2 s" in err and "PHUB_TIMEOUT" in err, err
    assert time.monotonic() - start < 30


def test_launch_sets_torch_variables_and_says_what_phub_carried():
    run = subprocess.run([sys.executable, "-m", "phub", "launch", "-n", "3", "--timeout", "60", "--",
                          "python", "-c", WORKER], capture_output=True, text=True, timeout=300, env=env(), cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = {}
    for line in run.stdout.splitlines():
        prefix, _, rest = line.partition("] ")
        if rest.startswith("{"):
            seen[prefix.strip("[")] = json.loads(rest)
    assert sorted(seen) == ["rank 0", "rank 1", "rank 2"], run.stdout
    for rank in range(3):
        got = seen[f"rank {rank}"]
        assert got["RANK"] == got["LOCAL_RANK"] == str(rank) and got["WORLD_SIZE"] == got["LOCAL_WORLD_SIZE"] == "3"
    assert {got["MASTER_ADDR"] for got in seen.values()} == {"127.0.0.1"}
    assert len({got["MASTER_PORT"] for got in seen.values()}) == 1 and int(seen["rank 0"]["MASTER_PORT"]) > 0
    carried = 2 * 3 * ELEMENTS * 4 * ROUNDS
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("phub: PHub carried 1 job(s), 3 worker(s)") and f"({carried} bytes)" in last, last
    assert f"in {ROUNDS} round(s)" in last
