"""The verbs data path, run end to end over the software RDMA provider (transport "soft-verbs").

The provider's own semantics first (what a NIC does with a write-with-immediate), then whole jobs:
real server cores and worker processes whose chunks move only by RDMA writes into registered
slots and results, checked against the closed-form oracles of test_exchange.py.
"""
import json
import socket
import subprocess

import numpy as np
import pytest

import phub
from phub.protocol import wire
from phub.errors import JobFailed
from phub.network.rdma import connect, immediate
from phub.network.rdma.fabric import Memory, Writer, drain, open_nic
from phub.network.links import recv_control
from conftest import finish, start_workers
from test_exchange import SIZES, STEPS, aggregate, assert_close, nag_oracle

BOUND = 30


def connected_pair(signal_every=1):
    a, b = open_nic("soft-verbs"), open_nic("soft-verbs")
    qa, qb = a.connection(sq_depth=4, signal_every=signal_every), b.connection()
    qa.connect(qb.local_params(b.scratch))
    qb.connect(qa.local_params(a.scratch))
    return a, b, qa, qb


def poll_until(nic, count, writers=None, rounds=2000):
    got = []
    for _ in range(rounds):
        got += drain(nic, writers) if writers is not None else nic.poll()
        if len(got) >= count:
            break
    return got


def test_a_write_lands_where_the_writer_said_once_a_receive_is_posted():
    a, b, qa, qb = connected_pair()
    source, target = a.register(Memory(8192)), b.register(Memory(8192))
    source.memory.floats(0, 1024)[:] = np.arange(1024, dtype=np.float32)
    assert qa.write_imm(source, 0, 4096, qb.local_params(target), 4096, immediate.encode(7, 42)) is True
    assert poll_until(b, 1, rounds=50) == []  # no receive posted: the write waits (RNR), nothing lands
    assert not target.memory.floats(4096, 1024).any()
    qb.post_receives(1)
    (landed,) = poll_until(b, 1)
    assert landed.received and landed.imm == immediate.encode(7, 42) and landed.byte_len == 4096
    assert landed.qp_num == qb.qp_num
    np.testing.assert_array_equal(target.memory.floats(4096, 1024), np.arange(1024, dtype=np.float32))
    (sent,) = a.poll()
    assert not sent.received and sent.wr_id == 1 and sent.qp_num == qa.qp_num
    for nic in (a, b):
        nic.close()


def test_writes_keep_their_order_and_a_full_send_queue_holds_back_in_the_writer():
    a, b, qa, qb = connected_pair(signal_every=2)
    source, target = a.register(Memory(4096)), b.register(Memory(4096 * 16))
    qb.post_receives(16)
    writer, params = Writer(qa), qb.local_params(target)
    for i in range(10):  # the send queue holds 4: the rest wait in the writer until completions free it
        source.memory.floats(0, 1)[0] = i
        writer.write(source, 0, 4, params, 4 * i, immediate.encode(0, i))
    assert writer.backlog
    landed = []
    for _ in range(2000):
        drain(a, {qa.qp_num: writer})
        landed += drain(b, {qb.qp_num: Writer(qb)})
        if len(landed) == 10:
            break
    assert [immediate.decode(c.imm)[1] for c in landed] == list(range(10))
    drain(a, {qa.qp_num: writer})  # the last signaled write's completion
    assert not writer.backlog and qa.credits.free == 4


def test_writes_outside_a_region_or_to_a_peer_that_is_gone_fail_the_job():
    a, b, qa, qb = connected_pair()
    source, target = a.register(Memory(4096)), b.register(Memory(4096))
    qb.post_receives(4)
    with pytest.raises(ValueError, match="outside the peer's"):
        qa.write_imm(source, 0, 8, qb.local_params(target), 4092, 0)
    forged = connect.ConnParams(**dict(qb.local_params(target).to_json(), rkey=target.rkey ^ 1))
    qa.write_imm(source, 0, 8, forged, 0, 0)
    with pytest.raises(JobFailed, match="remote access error"):
        poll_until(b, 1)
    b.close()
    with pytest.raises(JobFailed, match="is gone"):
        for _ in range(200):  # the kernel notices the closed peer within a few writes
            qa.credits.retired = qa.credits.posted
            qa.write_imm(source, 0, 4096, qb.local_params(target), 0, 0)
    a.close()


@pytest.mark.parametrize("workers,cores,interfaces", [(1, 1, ("127.0.0.1",)), (3, 2, ("127.0.0.1", "127.0.0.2"))],
                         ids=["1w-1core-1if", "3w-2core-2if"])
def test_nag_over_rdma_writes_matches_closed_form(run_exchange, workers, cores, interfaces):
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=1.0 / workers)
    results = run_exchange(workers, SIZES, STEPS, opt, cores=cores, interfaces=interfaces, transport="soft-verbs")
    for rank, saved in enumerate(results):
        assert str(saved["transport"]) == "soft-verbs"
        for i, shape in enumerate(SIZES):
            want = nag_oracle(workers, i, int(np.prod(shape)), STEPS, 0.1, 0.9, 1e-2, 1.0 / workers)
            assert_close(saved[f"final{i}"].reshape(-1), want, f"rank {rank} array {i}")


def test_aggregation_over_rdma_writes_is_exact_across_batches(run_exchange):
    sizes = [[20000], [8193], [5]]
    results = run_exchange(2, sizes, 3, None, cores=2, interfaces=("127.0.0.1", "127.0.0.2"),
                           transport="soft-verbs", lanes_per_pair=2, split_init=True)
    for saved in results:
        for step in range(1, 4):
            for i, shape in enumerate(sizes):
                want = aggregate(2, step, i, int(np.prod(shape)))
                np.testing.assert_array_equal(saved[f"sum{step}_{i}"].reshape(-1), want.astype(np.float32))


@pytest.mark.parametrize("layout", ["two-phase", "sharded"])
def test_racks_and_shards_over_rdma_writes(tmp_path, layout):
    from phub.launching.cluster import loopback
    from test_topologies import STEPS as RACK_STEPS, run

    cluster = loopback(4, racks=2) if layout == "two-phase" else loopback(2, shards=2)
    workers = 4 if layout == "two-phase" else 2
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=1.0 / workers)
    results = run(tmp_path, cluster, workers, opt, cores=2, transport="soft-verbs")
    for i, shape in enumerate(SIZES):
        want = nag_oracle(workers, i, int(np.prod(shape)), RACK_STEPS, 0.1, 0.9, 1e-2, 1.0 / workers)
        for rank, saved in enumerate(results):
            assert str(saved["transport"]) == "soft-verbs"
            assert_close(saved[f"final{i}"].reshape(-1), want, f"rank {rank}, array {i}")
            assert np.array_equal(saved[f"final{i}"], results[0][f"final{i}"]), f"rank {rank} differs from rank 0"


def test_two_jobs_share_a_server_over_rdma_writes(tmp_path):
    jobs = (phub.JobSpec(1, 2, "one"), phub.JobSpec(2, 3, "two"))
    server = phub.Server(phub.ServerConfig(jobs=jobs, cores=2, once=True, timeout=60, transport="soft-verbs")).start()
    procs, outs = [], {}
    try:
        for job in jobs:
            outs[job.job_id] = tmp_path / f"job{job.job_id}"
            outs[job.job_id].mkdir()
            params = {"sizes": SIZES, "steps": STEPS, "optimizer": None, "out_dir": str(outs[job.job_id])}
            procs += start_workers(server, job.num_workers, params, job_id=job.job_id, token=job.token)
        for code, err in finish(procs, timeout=120):
            assert code == 0, err
        assert server.wait(timeout=30) == 0
    finally:
        server.stop()
    for job in jobs:
        for rank in range(job.num_workers):
            saved = np.load(outs[job.job_id] / f"rank{rank}.npz")
            for i, shape in enumerate(SIZES):
                want = aggregate(job.num_workers, STEPS, i, int(np.prod(shape))).astype(np.float32)
                np.testing.assert_array_equal(saved[f"sum{STEPS}_{i}"].reshape(-1), want)


def test_bench_exchange_runs_phub_over_rdma_writes():
    from test_cli import HARNESS, run

    result = run("bench", "exchange", "--system", "phub", "--model", "googlenet", "--workers", "2", "--cores", "2",
                 "--iterations", "2", "--transport", "soft-verbs", "--verify", "--json", command=HARNESS)
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["verified"] is True and row["transport"] == "soft-verbs"
    result = run("bench", "exchange", "--network", "emulated", "--transport", "soft-verbs", command=HARNESS)
    assert result.returncode == 2 and "one network namespace" in result.stderr


def test_a_killed_worker_fails_the_rdma_job_within_a_bound(tmp_path):
    import signal
    import time

    config = phub.ServerConfig(jobs=(phub.JobSpec(0, 3),), cores=2, once=True, timeout=120, transport="soft-verbs")
    server = phub.Server(config).start()
    params = {"sizes": [[50000], [10]], "steps": 100000, "optimizer": phub.NAG().to_dict(),
              "out_dir": str(tmp_path), "announce": True}
    procs = start_workers(server, 3, params, timeout=120, stdout=subprocess.PIPE)
    try:
        for _ in range(3):
            assert procs[1].stdout.readline().startswith("step")
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        outcomes = finish([procs[0], procs[2]], timeout=BOUND)
        assert server.wait(timeout=BOUND) == 1
        assert time.monotonic() - killed_at < BOUND
        for code, err in outcomes:
            assert code != 0 and "worker 1 lost" in err, err
    finally:
        server.stop()
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_hello_with_bad_rdma_parameters_is_refused_naming_the_field():
    config = phub.ServerConfig(jobs=(phub.JobSpec(0, 1),), timeout=10, transport="soft-verbs")
    server = phub.Server(config).start()
    try:
        host, port = server.endpoints[0][0]
        with socket.create_connection((host, port), timeout=10) as sock:
            hello = {"job": 0, "token": "", "rank": 0, "num_workers": 1, "lane": 0, "shard": 0, "shards": 1,
                     "rdma": {"qp_num": 1, "psn": 2, "lid": 0, "gid": "not-a-gid", "mtu": 4096, "addr": 4096,
                              "rkey": 1, "length": 4096}}
            sock.sendall(wire.control_frame(wire.Kind.HELLO, 0, 0, hello))
            frame = recv_control(sock, 10)
        assert frame.header.kind is wire.Kind.ERROR
        message = frame.json()["message"]
        assert "rank 0" in message and "rdma.gid" in message
    finally:
        server.stop()
