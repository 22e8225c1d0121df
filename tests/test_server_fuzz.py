"""No byte sequence can take a server down: generated control messages over real loopback
connections to one live `phub server`, which also serves a token-protected job.

After every test the server must be alive, its core's memory within a bound, and the protected
job must complete an exchange with the closed-form SGD result. Each fuzzed REGISTER or OPTIMIZER
comes from a worker of a job of its own (one of many the server is started with), so a rejected
message may fail that job, and only that job.
"""
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phub
from phub.protocol import wire
from phub.protocol.admission import MAX_PENDING_PER_ADDRESS
from phub.errors import JobFailed
from phub.network.links import recv_control

ROOT = Path(__file__).resolve().parents[1]
PROTECTED, TOKEN, FUZZ_JOBS = 5000, "SECRET", range(1, 701)
PAIR = 4999  # a job of two workers
BUDGET = 4 << 20  # --max-job-bytes of the fuzzed server
RSS_GROWTH = 150 << 20  # how much the core may grow over the whole module
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
LR = 0.5

json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=30)
    | st.integers(-2**70, 2**70) | st.sampled_from([10**10, 10**12, 150000000, 2**32, 2**63, -1, 0, 1])
    | st.integers(0, 200_000).map(lambda n: "x" * n),  # up to a control frame larger than the pre-HELLO cap
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=8)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz") / "server.log"
    argv = [sys.executable, "-m", "phub", "server", "--timeout", "3", "--max-job-bytes", str(BUDGET),
            "--job", f"{PROTECTED}:1:{TOKEN}", "--job", f"{PAIR}:2"]
    for job in FUZZ_JOBS:
        argv += ["--job", f"{job}:1"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT)
    ready = json.loads(proc.stdout.readline())
    assert ready["max_job_bytes"] == BUDGET
    client = phub.connect(ready["address"], rank=0, num_workers=1, job_id=PROTECTED, token=TOKEN, timeout=30)
    weights = np.arange(64, dtype=np.float32)
    client.init("w", weights)
    client.set_optimizer(phub.SGD(learning_rate=LR))
    state = {"proc": proc, "address": ready["address"], "pid": ready["pids"][0], "client": client,
             "weights": weights.copy(), "round": 0, "log": log, "jobs": itertools.count(FUZZ_JOBS.start)}
    state["rss0"] = _rss(state["pid"])
    yield state
    client.close()
    proc.terminate()
    proc.wait(10)
    text = log.read_text()
    assert "crashed" not in text and "Traceback" not in text, text[-3000:]


@pytest.fixture(autouse=True)
def the_server_survives(server):
    yield
    assert server["proc"].poll() is None, "the server exited"
    assert _rss(server["pid"]) < server["rss0"] + RSS_GROWTH
    server["round"] += 1
    grad = np.full(64, float(server["round"]), np.float32)
    out = np.empty(64, np.float32)
    server["client"].pushpull("w", grad, out=out, timeout=30)
    server["weights"] -= np.float32(LR) * grad  # SGD without momentum, one worker: exact in float32
    np.testing.assert_array_equal(out, server["weights"])


def _connect(server) -> socket.socket:
    host, port = server["address"].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _send(sock, kind, job, obj, sender=0) -> None:
    try:
        sock.sendall(wire.control_frame(kind, job, sender, obj))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may have refused an earlier frame and closed already


def _reply(sock, timeout=20):
    """The server's next control frame, or None if it closed the connection without one."""
    try:
        return recv_control(sock, timeout, "the server")
    except (JobFailed, ConnectionResetError):
        return None


def _message(frame) -> str:
    assert frame is not None and frame.header.kind is wire.Kind.ERROR, frame
    return frame.json()["message"]


def _joined(server):
    """A connection admitted as rank 0, lane 0, of a fuzz job of its own."""
    job = next(server["jobs"])
    sock = _connect(server)
    _send(sock, wire.Kind.HELLO, job, {"job": job, "token": "", "rank": 0, "num_workers": 1, "lane": 0})
    frame = _reply(sock)
    assert frame is not None and frame.header.kind is wire.Kind.WELCOME, frame
    return sock, job


@FUZZ
@given(st.sampled_from(["job", "token", "rank", "num_workers", "lane", "shard", "shards", "rdma", "peer_rack",
                        "core", "interface", "other"]), json_values)
def test_any_hello_field_value(server, field, value):
    job = next(server["jobs"])
    hello = {"job": job, "token": "", "rank": 0, "num_workers": 1, "lane": 0, field: value}
    with _connect(server) as sock:
        _send(sock, wire.Kind.HELLO, job, hello)
        frame = _reply(sock)
        assert frame is not None, "closed without saying why"
        if frame.header.kind is wire.Kind.ERROR and not isinstance(value, int) and field != "other":
            message = _message(frame)
            assert field in message or "exceeds" in message or "unknown field" in message, message


@FUZZ
@given(json_values, st.lists(st.tuples(json_values, json_values), max_size=4), st.booleans())
def test_any_register(server, batch, pairs, plain):
    sock, job = _joined(server)
    with sock:
        body = {"batch": 0, "arrays": [list(p) for p in pairs]} if plain else {"batch": batch, "arrays": batch}
        _send(sock, wire.Kind.REGISTER, job, body)
        _send(sock, wire.Kind.ERROR, job, {"message": "fuzz done"})
        message = _message(_reply(sock))
        assert "REGISTER" in message or "register" in message or "fuzz done" in message, message


@FUZZ
@given(st.sampled_from(["nag", "sgd", "aggregate"]) | json_values,
       st.dictionaries(st.sampled_from(["learning_rate", "momentum", "wd", "average", "clip_gradient", "x"]),
                       json_values, max_size=3))
def test_any_optimizer(server, name, params):
    sock, job = _joined(server)
    with sock:
        _send(sock, wire.Kind.OPTIMIZER, job, {"name": name, **params})
        _send(sock, wire.Kind.ERROR, job, {"message": "fuzz done"})
        message = _message(_reply(sock))
        assert "OPTIMIZER" in message or "fuzz done" in message, message


@FUZZ
@given(st.sampled_from([wire.Kind.REGISTER, wire.Kind.OPTIMIZER, wire.Kind.ERROR, wire.Kind.PEER_READY,
                        wire.Kind.BYE, wire.Kind.WELCOME]), json_values, st.booleans())
def test_any_message_from_a_worker_or_a_stranger(server, kind, value, joined):
    sock, job = _joined(server) if joined else (_connect(server), PROTECTED)
    with sock:
        _send(sock, kind, job, {"message": value, "batch": value})
        if kind is wire.Kind.BYE and joined:
            return  # a clean goodbye: nothing to answer
        _send(sock, wire.Kind.ERROR, job, {"message": "fuzz done"})
        frame = _reply(sock)
        assert frame is not None and frame.header.kind is wire.Kind.ERROR


@FUZZ
@given(json_values, json_values)
def test_any_share(server, name, value):
    """Rank 0's SHARE comes back to it (the job's only worker) as sent, once per name; a bad name
    fails the job naming SHARE."""
    sock, job = _joined(server)
    with sock:
        _send(sock, wire.Kind.SHARE, job, {"name": name, "value": value})
        frame = _reply(sock)
        assert frame is not None
        if isinstance(name, str) and 0 < len(name) <= 256:
            assert frame.header.kind is wire.Kind.SHARE, _message(frame)
            assert json.dumps(frame.json()) == json.dumps({"name": name, "value": value})  # NaN too
            _send(sock, wire.Kind.SHARE, job, {"name": name, "value": 1})
            assert "shared already" in _message(_reply(sock))
        else:
            assert "SHARE" in _message(frame)


def test_only_rank_0_shares(server):
    with _connect(server) as sock:
        _send(sock, wire.Kind.HELLO, PAIR, {"job": PAIR, "token": "", "rank": 1, "num_workers": 2, "lane": 0})
        assert _reply(sock).header.kind is wire.Kind.WELCOME
        _send(sock, wire.Kind.SHARE, PAIR, {"name": "port", "value": 1}, sender=1)
        assert "only rank 0 shares" in _message(_reply(sock))


@pytest.mark.parametrize("hello, field", [
    ({"job": [1]}, "HELLO.job"), ({"lane": [0]}, "HELLO.lane"), ({"shards": 10**12}, "HELLO.shards"),
    ({"shards": 150000000}, "HELLO.shards"), ({"token": 7}, "HELLO.token"),
])
def test_the_reported_hellos_are_refused_at_once_naming_the_field(server, hello, field):
    job = next(server["jobs"])
    start = time.monotonic()
    with _connect(server) as sock:
        _send(sock, wire.Kind.HELLO, job, {"job": job, "token": "", "rank": 0, "num_workers": 1, "lane": 0, **hello})
        assert field in _message(_reply(sock))
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("arrays, field", [([["w", float("inf")]], "elements"), ([["w", 10**10]], "elements"),
                                           ([["w", BUDGET // 4]], "budget")])
def test_the_reported_registers_fail_only_their_job(server, arrays, field):
    sock, job = _joined(server)
    with sock:
        _send(sock, wire.Kind.REGISTER, job, {"batch": 0, "arrays": arrays})
        assert field in _message(_reply(sock))


def test_a_big_control_frame_before_hello_is_refused_without_allocating(server):
    socks = [_connect(server) for _ in range(16)]
    for sock in socks:
        sock.sendall(wire.pack_header(wire.Kind.HELLO, 0, 0, 0, 0, wire.MAX_CONTROL_BYTES))
    for sock in socks:
        assert "exceeds the 65536-byte limit" in _message(_reply(sock))
        sock.close()


def test_silent_connections_are_dropped_at_the_handshake_deadline(server):
    with _connect(server) as sock:
        start = time.monotonic()
        assert _reply(sock, 30) is None  # closed without a frame: it never said HELLO
        assert time.monotonic() - start < 15  # min(10 s, --timeout 3) plus a sweep, on a loaded machine


def test_pending_connections_per_address_are_capped_and_refusals_counted(server):
    socks = [_connect(server) for _ in range(MAX_PENDING_PER_ADDRESS)]
    extra = [_connect(server) for _ in range(6)]
    try:
        for sock in extra:
            assert _reply(sock) is None  # closed at once
    finally:
        for sock in socks + extra:
            sock.close()
    text = server["log"].read_text()
    assert text.count("too many connections from 127.0.0.1") == 1, text[-2000:]


def test_a_flood_of_refusals_is_logged_once_with_a_counter(server):
    # causes are logged once per server: an earlier test may already have logged this one
    before = server["log"].read_text().count("wrong token for job")
    for _ in range(20):
        with _connect(server) as sock:
            _send(sock, wire.Kind.HELLO, PROTECTED, {"job": PROTECTED, "token": "guess", "rank": 0,
                                                     "num_workers": 1, "lane": 0})
            assert "wrong token for job 5000" in _message(_reply(sock))
    text = server["log"].read_text()
    assert text.count("wrong token for job") - before <= 1 and text.count("wrong token for job") >= 1, text[-2000:]


def test_a_connection_says_hello_once(server):
    job = next(server["jobs"])
    with _connect(server) as sock:
        hello = {"job": job, "token": "", "rank": 0, "num_workers": 1, "lane": -1}
        _send(sock, wire.Kind.HELLO, job, hello)
        assert _reply(sock).header.kind is wire.Kind.WELCOME
        _send(sock, wire.Kind.HELLO, job, hello)
        assert "HELLO sent twice" in _message(_reply(sock))
