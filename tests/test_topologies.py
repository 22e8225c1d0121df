"""Jobs laid out beyond one server: shards on every worker (PShard) and one PBox per rack with
two-phase reduction (a reduce-scatter / all-gather between the racks, each (core, interface) of a
PBox on its own link). Real `phub server` processes and workers on loopback addresses."""
import json
import os
import select
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

import phub
from phub.launching.cluster import Node, loopback
from phub.launching.launch import free_port, run_job, worker_env
from conftest import WORKER
from test_exchange import SIZES, aggregate, assert_close, nag_oracle
from workers.exchange_worker import SHARED_EARLY, SHARED_LATE, initial

STEPS = 3


def run(tmp_path, cluster, workers, optimizer, cores=1, transport="tcp", share=False, **config):
    params = {"sizes": SIZES, "steps": STEPS, "optimizer": optimizer and optimizer.to_dict(), "out_dir": str(tmp_path),
              "share": share}
    server = phub.ServerConfig(cores=cores, timeout=60, transport=transport, **config)
    result = run_job([sys.executable, WORKER], workers, server, cluster, extra_env={"PHUB_TEST": json.dumps(params)})
    assert result.status == 0, result.failed
    return [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(workers)]


def nag(workers):
    return phub.NAG(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=1.0 / workers)


def assert_nag_oracle_everywhere(results):
    """Every rank ends with the closed form of `nag(workers)` after STEPS steps, bit-identical to
    rank 0's, from rank 0's initial values."""
    workers = len(results)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        want = nag_oracle(workers, i, size, STEPS, 0.1, 0.9, 1e-2, 1.0 / workers)
        for rank, saved in enumerate(results):
            # rank 0's initial values reached every rack, although each rack's first worker pushed its own
            assert np.array_equal(saved[f"init{i}"].reshape(-1), initial(size, i)), f"rank {rank}: init {i}"
            assert_close(saved[f"final{i}"].reshape(-1), want, f"rank {rank}, array {i}")
            assert np.array_equal(saved[f"final{i}"], results[0][f"final{i}"]), f"rank {rank} differs from rank 0"


@pytest.mark.parametrize("racks, workers, cores", [(2, 4, 1), (2, 2, 2), (3, 3, 1), (4, 4, 1)])
def test_two_phase_reduction_matches_the_oracle_bit_identically_across_racks(tmp_path, racks, workers, cores):
    assert_nag_oracle_everywhere(run(tmp_path, loopback(workers, racks=racks), workers, nag(workers), cores))


@pytest.mark.parametrize("transport", ["tcp", "soft-verbs"])
def test_racks_of_several_cores_and_interfaces_end_bit_identical_on_every_transport(tmp_path, transport):
    """Each (core, interface) of a PBox exchanges its chunks with the same (core, interface) of the
    other rack on its own link (one loopback address per interface); the workers' data path is
    TCP or the verbs one, the racks' links are TCP either way."""
    assert_nag_oracle_everywhere(run(tmp_path, loopback(4, interfaces=2, racks=2), 4, nag(4), cores=2,
                                     transport=transport))


def test_two_phase_aggregation_only_sums_every_rack(tmp_path):
    results = run(tmp_path, loopback(4, racks=2), 4, None)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        for step in range(1, STEPS + 1):
            want = aggregate(4, step, i, size).astype(np.float32)
            for saved in results:
                assert np.array_equal(saved[f"sum{step}_{i}"].reshape(-1), want)


@pytest.mark.parametrize("transport", ["tcp", "soft-verbs"])
def test_one_pbox_simulating_racks_ends_as_racks_pushing_the_same_gradients_would(tmp_path, transport):
    """The paper's rack simulation: every chunk's local aggregate goes through its core's own
    interface back to itself and is added again, once per simulated rack, so the optimizer sees
    3 racks' worth of the same gradients (rescaled by 1 / (3 x workers): the one-rack oracle)."""
    results = run(tmp_path, loopback(2, interfaces=2), 2, nag(3 * 2), cores=2, transport=transport,
                  simulated_racks=3)
    assert_nag_oracle_everywhere(results)


def test_simulated_racks_aggregation_only_sums_every_simulated_rack(tmp_path):
    results = run(tmp_path, loopback(2), 2, None, simulated_racks=4)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        for step in range(1, STEPS + 1):
            want = (4 * aggregate(2, step, i, size)).astype(np.float32)
            for saved in results:
                assert np.array_equal(saved[f"sum{step}_{i}"].reshape(-1), want)


def test_sharded_servers_on_every_worker(tmp_path):
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=0.0, rescale_grad=1.0 / 3)
    results = run(tmp_path, loopback(3, shards=3), 3, opt, cores=2)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        want = nag_oracle(3, i, size, STEPS, 0.1, 0.9, 0.0, 1.0 / 3)
        for saved in results:
            assert_close(saved[f"final{i}"].reshape(-1), want, f"array {i}")


@pytest.mark.parametrize("layout", ["racks", "shards"])
def test_rank_0_shares_with_every_rack_and_through_sharded_servers(tmp_path, layout):
    """A SHARE goes to rank 0's server (lane 0's core), which hands it to its workers and, with
    two-phase reduction, to the other racks' servers for theirs."""
    cluster = loopback(4, racks=2) if layout == "racks" else loopback(3, shards=3)
    workers = len(cluster.workers)
    results = run(tmp_path, cluster, workers, phub.NAG(learning_rate=0.1, rescale_grad=1.0 / workers), cores=2,
                  share=True)
    for saved in results:
        assert json.loads(str(saved["shared"])) == [SHARED_EARLY, SHARED_LATE]


class CuttingProxy:
    """Forwards one TCP connection from `listen` to `target` (connecting from `source`) and cuts it,
    both ways at once, once `cut_after` bytes went through: a rack link lost mid-run."""

    def __init__(self, listen, target, source, cut_after):
        self.server = socket.create_server(listen)
        self.target, self.source, self.cut_after = target, source, cut_after
        self.cut = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self, deadline=60.0):
        self.server.settimeout(deadline)
        try:
            inside, _ = self.server.accept()
        except OSError:
            return
        outside = socket.create_connection(self.target, timeout=deadline, source_address=(self.source, 0))
        moved, ends = 0, {inside: outside, outside: inside}
        with inside, outside, self.server:
            while moved < self.cut_after:
                readable, _, _ = select.select(list(ends), [], [], deadline)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    ends[sock].sendall(data)
                    moved += len(data)
            self.cut.set()


def test_losing_one_rack_link_mid_run_fails_the_job_naming_that_link(tmp_path):
    """Two racks of two interfaces; rack 0 reaches rack 1's interface 1 through a proxy that cuts
    the link mid-run. Both racks' servers end the job and every worker exits naming the link."""
    racks = (("127.3.0.1", "127.3.0.2"), ("127.3.1.1", "127.3.1.2"))
    proxy = "127.3.9.2"  # stands for rack 1's interface 1, as rack 0 sees it
    here = [a for addresses in racks for a in addresses] + [proxy]
    port = free_port(Node("here", tuple(here)), here)
    views = (f"{'+'.join(racks[0])}:{port}", f"{racks[1][0]}+{proxy}:{port}")  # rack 0's view of the racks
    servers = []
    for rack in (1, 0):  # the called rack first, so rack 0 finds it listening
        peers = views if rack == 0 else (views[0], f"{'+'.join(racks[1])}:{port}")
        config = phub.ServerConfig(jobs=(phub.JobSpec(0, 1, "", rack, 2),), interfaces=racks[rack], port=port,
                                   rack=rack, peers=peers, once=True, timeout=20, chunk_bytes=4096)
        servers.append(phub.Server(config))
    cutter = CuttingProxy((proxy, port), (racks[1][1], port), racks[0][1], cut_after=1 << 20)  # past the initial weights
    params = {"sizes": SIZES, "steps": 100000, "optimizer": phub.NAG(rescale_grad=0.5).to_dict(),
              "out_dir": str(tmp_path)}
    procs = []
    try:
        for server in servers:
            server.start()
        for rank, server in enumerate(reversed(servers)):
            env = dict(os.environ, PHUB_TEST=json.dumps(params), **worker_env(server.address, rank, 2, 0, "", 20))
            procs.append(subprocess.Popen([sys.executable, WORKER], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
        outcomes = [proc.communicate(timeout=60) for proc in procs]
        statuses = [server.wait(30) for server in servers]
    finally:
        for proc in procs:
            proc.kill()
        for server in servers:
            server.stop()
    assert cutter.cut.is_set(), "the link was never cut: the job ended first"
    assert statuses == [1, 1]  # both racks' servers failed the job
    for rank, (proc, (_, err)) in enumerate(zip(procs, outcomes)):
        assert proc.returncode != 0, f"rank {rank} exited 0"
        assert "server lost (the link of core 0 / interface 1, " in err, f"rank {rank}: {err[-2000:]}"
