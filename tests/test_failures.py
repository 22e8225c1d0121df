"""What the user sees when something goes wrong: a lost worker, a refused connection, bad bytes."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import phub
from phub.protocol import wire
from conftest import WORKER, finish, start_workers

BOUND = 30  # seconds within which everyone must have exited after a failure


def test_killed_worker_stops_the_server_and_the_other_workers(tmp_path):
    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 3),), cores=2, once=True, timeout=120)).start()
    try:
        params = {"sizes": [[50000], [10]], "steps": 100000, "optimizer": phub.NAG().to_dict(),
                  "out_dir": str(tmp_path), "announce": True}
        procs = start_workers(server, 3, params, timeout=120, stdout=subprocess.PIPE)
        for _ in range(3):  # rank 1 is mid-run: it has finished a few steps
            line = procs[1].stdout.readline()
            assert line.startswith("step"), line
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        outcomes = finish([procs[0], procs[2]], timeout=BOUND)
        server_status = server.wait(timeout=BOUND)
        elapsed = time.monotonic() - killed_at
        assert elapsed < BOUND
        for rank, (code, err) in zip((0, 2), outcomes):
            assert code != 0, f"rank {rank} should fail after rank 1 died"
            assert "worker 1 lost" in err, f"rank {rank}'s error does not name the lost worker:\n{err}"
        assert server_status == 1
    finally:
        server.stop()
        for proc in procs:
            proc.kill()
            proc.wait()


def test_workers_waiting_for_a_rank_that_never_connects_are_told_which_within_the_connect_timeout():
    """Two of a job's three workers wait in init for the third, which never starts: the server
    fails the job once the connect timeout has passed since the first connected (not after the
    workers' 300 s step timeout), and each worker's error names the missing rank."""
    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 3),), once=True, timeout=300,
                                           connect_timeout=2)).start()
    errors = {}

    def worker(rank):
        try:
            phub.connect(server.address, rank=rank, num_workers=3).init("w", np.zeros(8, np.float32))
        except phub.JobFailed as exc:
            errors[rank] = str(exc)

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in (0, 1)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(BOUND)
        assert not any(thread.is_alive() for thread in threads), "a worker still waits"
        assert server.wait(timeout=BOUND) == 1
    finally:
        server.stop()
    for rank in (0, 1):
        assert "rank(s) [2] never connected within 2 s" in errors.get(rank, ""), errors


def test_launch_runs_workers_with_rank_prefixed_output(tmp_path):
    params = {"sizes": [[100]], "steps": 2, "optimizer": None, "out_dir": str(tmp_path), "announce": True}
    env = dict(os.environ, PHUB_TEST=json.dumps(params))
    run = subprocess.run([sys.executable, "-m", "phub", "launch", "-n", "2", "--cores", "2", "--",
                          sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "[rank 0] step 2" in run.stdout and "[rank 1] step 2" in run.stdout
    assert sorted(os.listdir(tmp_path)) == ["rank0.npz", "rank1.npz"]


def test_launch_fails_when_a_worker_fails(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(
        "import os, sys, numpy as np, phub\n"
        "kv = phub.connect()\n"
        "w = np.zeros(10, np.float32)\n"
        "kv.init('w', w)\n"
        "if kv.rank == 1:\n"
        "    sys.exit('rank 1 gives up on purpose')\n"
        "kv.pushpull('w', np.ones(10, np.float32))\n"
    )
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "phub", "launch", "-n", "2", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert time.monotonic() - start < BOUND + 10
    assert "rank 1 gives up on purpose" in run.stderr
    # sys.exit leaves the job as a normal end does (BYE): rank 0's next push then fails the job at once,
    # and the launcher names rank 1 (the server says it left first), with its last words
    assert "phub launch: rank 1 on worker1 failed first (status 1): rank 1 gives up on purpose" in run.stderr, \
        run.stderr


def _raw_hello(address, **fields):
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    hello = {"job": 0, "token": "", "rank": 0, "num_workers": 1, "lane": -1, **fields}
    sock.sendall(wire.control_frame(wire.Kind.HELLO, hello["job"], hello["rank"], hello))
    return sock


@pytest.fixture
def server():
    srv = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(7, 1, "s3cret"),))).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("kwargs, message", [
    ({"job_id": 8, "token": "s3cret"}, "job 8 is not registered"),
    ({"job_id": 7, "token": "wrong"}, "wrong token for job 7"),
    ({"job_id": 7, "token": "s3cret", "num_workers": 2}, "expects 2 workers, job 7 has 1"),
])
def test_refused_connections_say_why(server, kwargs, message):
    kwargs.setdefault("num_workers", 1)
    with pytest.raises(phub.JobFailed, match=message):
        phub.connect(server.address, rank=0, timeout=10, **kwargs)


def test_garbage_is_dropped_and_the_job_still_works(server):
    host, port = server.address.split(":")
    for junk in (b"GET / HTTP/1.1\r\n\r\n" + b"x" * 40, b"\x00" * 32, os.urandom(64)):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(junk)
        header = wire.decode_header(_recv_exact(sock, wire.HEADER_BYTES))
        assert header.kind is wire.Kind.ERROR
        assert b"protocol error" in _recv_exact(sock, header.length)
        assert _closed_by_peer(sock)
        sock.close()
    kv = phub.connect(server.address, rank=0, num_workers=1, job_id=7, token="s3cret", timeout=10)
    w = np.arange(5, dtype=np.float32)
    kv.init("w", w)
    kv.set_optimizer(phub.SGD(learning_rate=1.0))
    kv.pushpull("w", np.ones(5, np.float32), out=w)
    assert np.array_equal(w, np.arange(5, dtype=np.float32) - 1)
    kv.close()


def _closed_by_peer(sock):
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # it closed with our unread junk still queued
        return True


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        assert part, "connection closed early"
        buf += part
    return buf


def test_pushpull_times_out_naming_the_missing_chunks():
    srv = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 2),), timeout=60)).start()
    try:
        import threading
        clients = [None, None]

        def join(rank):
            clients[rank] = phub.connect(srv.address, rank=rank, num_workers=2, timeout=20)
            clients[rank].init("w", np.zeros(3, np.float32))

        threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        with pytest.raises(phub.PHubTimeout, match=r"pushpull of key 'w' \(iteration 1\) timed out .*chunks 0"):
            clients[0].pushpull("w", np.ones(3, np.float32), timeout=0.5)
    finally:
        srv.stop()


def test_share_refuses_what_it_cannot_send_and_times_out_naming_the_value(server):
    with phub.connect(server.address, rank=0, num_workers=1, job_id=7, token="s3cret", timeout=10) as kv:
        for name, value, message in [("", 1, "name must be"), (7, 1, "name must be"), ("x" * 257, 1, "name must be"),
                                     ("v", object(), "cannot be sent as JSON"),
                                     ("v", "x" * (1 << 20), "at most 1048576")]:
            with pytest.raises(phub.ConfigError, match=message):
                kv.share(name, value)
        assert kv.share("v", {"a": [1, 2]}) == {"a": [1, 2]}
        with pytest.raises(phub.ConfigError, match="shared this name already"):
            kv.share("v", 2)
    srv = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 2),), timeout=60)).start()
    try:  # rank 1 asks; rank 0 never shares
        import threading
        clients = [None, None]
        threads = [threading.Thread(target=lambda r=r: clients.__setitem__(
            r, phub.connect(srv.address, rank=r, num_workers=2, timeout=20))) for r in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        with pytest.raises(phub.PHubTimeout, match="share of 'port' timed out"):
            clients[1].share("port", timeout=0.5)
    finally:
        srv.stop()


def test_connect_without_launcher_environment_names_the_variable(monkeypatch):
    monkeypatch.delenv("PHUB_SERVER", raising=False)
    with pytest.raises(phub.ConfigError, match="PHUB_SERVER is not set"):
        phub.connect()
