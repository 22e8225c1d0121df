"""Fault injection on loopback: a lost server core, a straggler, hostile bytes on a live server,
and one job's client trying to touch another job's chunks."""
import os
import random
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

import phub
from phub.protocol import wire
from conftest import finish, start_workers
from test_exchange import SIZES, assert_close, nag_oracle

BOUND = 30


def test_killed_server_core_fails_every_worker_and_the_server(tmp_path):
    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 2),), cores=2, once=True, timeout=120)).start()
    procs = []
    try:
        params = {"sizes": [[50000]], "steps": 100000, "optimizer": phub.NAG().to_dict(),
                  "out_dir": str(tmp_path), "announce": True}
        procs = start_workers(server, 2, params, timeout=120, stdout=subprocess.PIPE)
        assert procs[0].stdout.readline().startswith("step")
        os.kill(server.pids[1], signal.SIGKILL)
        start = time.monotonic()
        outcomes = finish(procs, timeout=BOUND)
        assert server.wait(timeout=BOUND) == 1
        assert time.monotonic() - start < BOUND
        for rank, (code, err) in enumerate(outcomes):
            assert code != 0 and "lost the phub server" in err, f"rank {rank}:\n{err}"
    finally:
        server.stop()
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_straggler_slows_the_job_but_it_completes_correctly(tmp_path, run_exchange):
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=0.0, rescale_grad=0.5)
    started = time.monotonic()
    results = run_exchange(2, SIZES, 3, opt, slow={"rank": 1, "seconds": 0.3})
    assert time.monotonic() - started >= 0.9  # every round waited for the straggler
    for i, shape in enumerate(SIZES):
        want = nag_oracle(2, i, int(np.prod(shape)), 3, 0.1, 0.9, 0.0, 0.5)
        for saved in results:
            assert_close(saved[f"final{i}"].reshape(-1), want, f"array {i}")


def _hostile_frames(rng):
    """Random bytes, valid headers with wild fields, and truncated or mutated HELLOs."""
    hello = wire.control_frame(wire.Kind.HELLO, 0, 0, {"job": 0, "token": "", "rank": 0, "num_workers": 2, "lane": 0})
    for _ in range(40):
        choice = rng.randrange(4)
        if choice == 0:
            yield rng.randbytes(rng.randrange(1, 200))
        elif choice == 1:
            kind = rng.choice(list(wire.Kind))
            yield wire.pack_header(kind, rng.randrange(3), rng.randrange(5), rng.randrange(1 << 32),
                                   rng.randrange(5), rng.randrange(1 << 16)) + rng.randbytes(rng.randrange(64))
        elif choice == 2:
            raw = bytearray(hello)
            raw[rng.randrange(len(raw))] = rng.randrange(256)
            yield bytes(raw)
        else:
            yield hello[:rng.randrange(len(hello))]


def test_hostile_connections_never_disturb_a_running_job(tmp_path):
    """Fuzz a live server while a real job runs; the job's results stay exact and the server lives."""
    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, 2, "tok"),), cores=2, once=True, timeout=60)).start()
    try:
        params = {"sizes": SIZES, "steps": 40, "optimizer": phub.NAG(wd=0.0, rescale_grad=0.5).to_dict(),
                  "out_dir": str(tmp_path)}
        procs = start_workers(server, 2, params, token="tok")
        host, port = server.address.split(":")
        rng = random.Random(1234)
        sent = 0
        for payload in _hostile_frames(rng):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                try:
                    sock.sendall(payload)
                    sock.shutdown(socket.SHUT_WR)
                    sock.recv(4096)  # the server answers (ERROR) or just closes; either ends it
                except OSError:
                    pass
            sent += 1
        outcomes = finish(procs, timeout=60)
        for rank, (code, err) in enumerate(outcomes):
            assert code == 0, f"rank {rank} failed under fuzzing:\n{err}"
        assert server.wait(timeout=30) == 0
        assert sent == 40
        from numpy import load
        for i, shape in enumerate(SIZES):
            want = nag_oracle(2, i, int(np.prod(shape)), 40, 0.01, 0.9, 0.0, 0.5)
            assert_close(load(tmp_path / "rank0.npz")[f"final{i}"].reshape(-1), want, f"array {i}")
    finally:
        server.stop()


def test_a_client_of_one_job_cannot_touch_another_jobs_chunks(tmp_path):
    """Job 1's credentials only open job 1's connections; frames naming job 2 are refused and job 2
    is untouched (its results stay exact)."""
    server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(1, 1, "one"), phub.JobSpec(2, 1, "two")))).start()
    try:
        victim = phub.connect(server.address, rank=0, num_workers=1, job_id=2, token="two", timeout=10)
        w = np.zeros(100, np.float32)
        victim.init("w", w)
        victim.set_optimizer(phub.SGD(learning_rate=1.0))
        with pytest.raises(phub.JobFailed, match="wrong token for job 2"):
            phub.connect(server.address, rank=0, num_workers=1, job_id=2, token="one", timeout=10)
        attacker = phub.connect(server.address, rank=0, num_workers=1, job_id=1, token="one", timeout=10)
        mine = np.zeros(100, np.float32)
        attacker.init("w", mine)
        # a hand-made frame claiming job 2 on job 1's lane: the server refuses it and fails job 1 only
        payload = np.full(100, 1e6, np.float32)
        attacker._submit([(attacker._links[0], wire.pack_header(wire.Kind.PUSH, 2, 0, 0, 1, 400), memoryview(payload).cast("B"))])
        with pytest.raises(phub.JobFailed, match="PUSH frame for job 2 on a connection of job 1"):
            attacker.pushpull("w", np.ones(100, np.float32), timeout=10)
        for _ in range(3):
            victim.pushpull("w", np.ones(100, np.float32), out=w)
        assert np.all(w == -3.0)
        victim.close()
    finally:
        server.stop()
