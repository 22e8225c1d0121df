"""Faults inside an emulated rack: a worker's link is cut (ip link set down) mid-run. A cut that is
restored before the job's timeout ends in completion with exact results; a cut that lasts ends
with every process exiting non-zero within a bounded time, naming the stall, and nothing left
behind. Needs root (CI runs as root)."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import phub
from experiments.rack.emulated import EmulatedRack
from phub.launching.launch import run_job
from conftest import WORKER
from test_exchange import assert_close, nag_oracle

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="the emulated rack needs root and iproute2")

SPEC = {"racks": 1, "workers_per_rack": 2, "pbox_interfaces": 1, "link_gbps": 10,
        "scale": {"network": 50, "model": 50}, "preflight": {"seconds": 0.3}}
TIMEOUT = 8.0  # the job's stall timeout and every blocking call's


def _cut_link_during(cluster, tmp_path, steps, restore_after):
    """Run a 2-worker job; once rank 1 has done 3 steps, take its link down (and maybe back up)."""
    params = {"sizes": [[20000], [7]], "steps": steps, "optimizer": phub.NAG(wd=0.0, rescale_grad=0.5).to_dict(),
              "out_dir": str(tmp_path), "announce": True}
    ns = cluster.workers[1].prefix[-1]
    log = tmp_path / "out.txt"
    cut = threading.Event()

    def watch_and_cut():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not cut.is_set():
            if log.exists() and log.read_text().count("[rank 1] step") >= 3:
                subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "dev", "eth0", "down"], check=True)
                cut.set()
                if restore_after is not None:
                    time.sleep(restore_after)  # how long the link stays cut: the fault itself
                    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "dev", "eth0", "up"], check=True)
                return
            time.sleep(0.05)  # polling the job's output file, not synchronizing with it

    watcher = threading.Thread(target=watch_and_cut)
    watcher.start()
    started = time.monotonic()
    with open(log, "w") as out:
        result = run_job([sys.executable, WORKER], 2, phub.ServerConfig(timeout=TIMEOUT), cluster,
                         extra_env={"PHUB_TEST": json.dumps(params)}, stdout=out, stderr=out)
    watcher.join()
    assert cut.is_set(), "the link was never cut: the job ended too early"
    return result, time.monotonic() - started, log.read_text()


def test_a_link_cut_briefly_delays_the_job_which_then_completes_exactly(tmp_path):
    with EmulatedRack(SPEC) as cluster:
        result, _, output = _cut_link_during(cluster, tmp_path, steps=40, restore_after=1.0)
    assert result.status == 0, output[-3000:]
    for i, size in enumerate((20000, 7)):
        want = nag_oracle(2, i, size, 40, 0.01, 0.9, 0.0, 0.5)
        for rank in range(2):
            assert_close(np.load(tmp_path / f"rank{rank}.npz")[f"final{i}"].reshape(-1), want, f"rank {rank}")


def test_a_link_that_stays_cut_stops_everyone_within_a_bound_naming_the_stall(tmp_path):
    with EmulatedRack(SPEC) as cluster:
        result, elapsed, output = _cut_link_during(cluster, tmp_path, steps=100000, restore_after=None)
        namespaces = [node.prefix[-1] for node in cluster.workers + cluster.servers]
        leftovers = [ns for ns in namespaces
                     if subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.strip()]
    assert result.status != 0
    assert elapsed < 4 * TIMEOUT + 30, f"took {elapsed:.0f} s"
    assert "stalled" in output or "timed out" in output, output[-3000:]
    assert leftovers == [], f"processes left in {leftovers}"
