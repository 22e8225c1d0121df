"""One server core's protocol (phub.protocol.core.CoreProtocol) driven without sockets or
processes: connections are phub.protocol.testing.MemoryConnections, time is a FakeClock, and every frame
goes in as the bytes a worker would send. Each test checks the frames that come back, the
connections that are closed and the job's end; results against the closed form."""
import json

import numpy as np
import pytest

from phub.protocol import wire
from phub.config import JobSpec, ServerConfig
from phub.errors import ConfigError, ProtocolError
from phub.reduction.kernels import get_backend
from phub.reduction.optim import SGD
from phub.protocol.admission import HANDSHAKE_SECONDS, MAX_PENDING_PER_ADDRESS
from phub.protocol.core import CoreProtocol, drain_pushes
from phub.protocol.testing import FakeClock, MemoryConnection, feed, frames_of
from conftest import refused

K = wire.Kind
CHUNK_BYTES = 1024
SIZE = 300  # floats: two chunks (256 + 44), one lane
TOKEN = "s3cret"
TIMEOUT = 60.0
LR = 0.5


class Dropped(Exception):
    """The protocol closed the connection: a link would read nothing more from it."""


class Core:
    """A CoreProtocol with what it logged and reported, and helpers that speak for workers."""

    def __init__(self, workers=2, first_rank=0, total_workers=None, interfaces=("198.18.0.1",), **config):
        self.clock = FakeClock()
        self.logs, self.reports = [], []
        spec = JobSpec(0, workers, TOKEN, first_rank=first_rank, total_workers=total_workers or workers)
        self.config = ServerConfig(jobs=(spec,), interfaces=interfaces, chunk_bytes=CHUNK_BYTES,
                                   timeout=TIMEOUT, once=True, **config)
        self.opened = []  # (address, source address, connection) of each link to another rack
        self.protocol = CoreProtocol(self.config, 0, [[(address, 9000) for address in interfaces]],
                                     get_backend("reference"), open_connection=self._open, log=self.logs.append,
                                     report=self.reports.append, clock=self.clock)

    def _open(self, address, source):
        conn = MemoryConnection(f"{source} to {address[0]}:{address[1]}")
        self.opened.append((address, source, conn))
        return conn

    @property
    def job(self):
        return self.protocol.jobs[0]

    def connect(self, name="", address="198.18.0.2", interface=0):
        conn = MemoryConnection(name)
        assert self.protocol.refusal(address) is None
        self.protocol.connection_made(conn, interface, address)
        return conn

    def send(self, conn, data: bytes):
        """Bytes from the peer of `conn`, received as a link receives them (none once it is closed)."""
        def target(header):
            if conn.closed:
                raise Dropped
            return self.protocol.payload_target(conn, header)

        def on_frame(frame):
            if conn.closed:
                raise Dropped
            self.protocol.frame_received(conn, frame)

        try:
            feed(data, target, on_frame)
        except Dropped:
            pass

    def hello(self, conn, rank, lane=0, token=TOKEN, **fields):
        body = {"job": 0, "token": token, "rank": rank, "num_workers": self.job.spec.total_workers, "lane": lane,
                **fields}
        self.send(conn, wire.control_frame(K.HELLO, 0, rank, body))

    def worker(self, rank):
        conn = self.connect(f"rank {rank}")
        self.hello(conn, rank)
        [welcome] = conn.take()
        assert welcome.header.kind is K.WELCOME, welcome
        return conn

    def register(self, conn, rank):
        self.send(conn, wire.control_frame(K.REGISTER, 0, rank, {"batch": 0, "arrays": [["w", SIZE]]}))

    def ready_job(self, workers=2, optimizer=SGD(learning_rate=LR)):
        """Every worker connected and registered, rank 0's initial weights (all ones) in, READY out."""
        conns = [self.worker(rank) for rank in range(workers)]
        for rank, conn in enumerate(conns):
            self.register(conn, rank)
        self.init(conns[0], np.ones(SIZE, np.float32))
        for conn in conns:
            frames = conn.take()
            assert [f.header.kind for f in frames] == [K.RESULT, K.RESULT, K.READY]
            assert json.loads(bytes(frames[-1].payload)) == {"batch": 0}
        if optimizer is not None:
            self.send(conns[0], wire.control_frame(K.OPTIMIZER, 0, 0, optimizer.to_dict()))
        return conns

    def init(self, conn, values):
        for chunk, (start, end) in enumerate(((0, 256), (256, SIZE))):
            self.send(conn, wire.pack_header(K.INIT, 0, 0, chunk, 0, 4 * (end - start)) + values[start:end].tobytes())

    def push(self, conn, rank, iteration, values):
        for chunk, (start, end) in enumerate(((0, 256), (256, SIZE))):
            self.send(conn, wire.pack_header(K.PUSH, 0, rank, chunk, iteration, 4 * (end - start))
                      + values[start:end].tobytes())


def results(conn):
    """The RESULT frames sent on `conn`, as one float32 array per iteration."""
    by_round = {}
    for frame in conn.take():
        assert frame.header.kind is K.RESULT, frame.header
        by_round.setdefault(frame.header.iteration, []).append((frame.header.chunk, bytes(frame.payload)))
    return {it: np.frombuffer(b"".join(p for _, p in sorted(parts)), np.float32) for it, parts in by_round.items()}


def error_of(conn):
    assert conn.closed and conn.finished_with is not None
    frame = wire.decode_header(conn.finished_with[:wire.HEADER_BYTES])
    assert frame.kind is K.ERROR
    return json.loads(conn.finished_with[wire.HEADER_BYTES:])["message"]


# -- handshake --------------------------------------------------------------------------------
def test_discovery_answers_with_the_layout_and_takes_nothing_more():
    core = Core()
    conn = core.connect()
    assert conn.max_control == wire.HANDSHAKE_CONTROL_BYTES  # a stranger: small frames only
    core.hello(conn, 0, lane=-1)
    [welcome] = conn.take()
    body = welcome.json()
    assert body["cores"] == 1 and body["endpoints"] == [[["198.18.0.1", 9000]]] and body["first_rank"] == 0
    assert body["transport"] == "tcp" and "rdma" not in body
    refused(lambda: core.hello(conn, 0, lane=-1), "HELLO sent twice")
    refused(lambda: core.register(conn, 0), "REGISTER frame before HELLO")
    assert core.job.state is None and core.reports == []


def test_a_lane_hello_admits_the_worker_and_lifts_the_frame_limit():
    core = Core(report_joins=True)
    conn = core.connect()
    core.hello(conn, 1)
    [welcome] = conn.take()
    assert welcome.header.kind is K.WELCOME and welcome.json()["workers_here"] == 2
    assert conn.max_control == wire.MAX_CONTROL_BYTES and not conn.closed
    assert core.reports == [{"event": "joined", "job": 0, "rank": 1}]
    assert core.job.links[0] == [None, conn]
    assert core.protocol.strangers.pending == {}


@pytest.mark.parametrize("hello, words", [
    ({"token": "wrong"}, ["wrong token for job 0"]),
    ({"rank": 5}, ["rank 5 is not one of this server's ranks"]),
    ({"lane": 3}, ["lane 3 is not served on this core/interface"]),
])
def test_a_refused_hello_gets_an_error_and_the_connection_is_closed(hello, words):
    core = Core()
    conn = core.connect()
    core.hello(conn, **{"rank": 0, **hello})
    message = error_of(conn)
    for word in words:
        assert word in message, message
    assert conn not in core.protocol.peers and core.protocol.strangers.pending == {}
    assert any("refused a connection" in line for line in core.logs)


def test_every_worker_must_agree_on_the_shard_layout():
    core = Core()
    core.worker(0)
    conn = core.connect()
    core.hello(conn, 1, shard=1, shards=2)
    assert "rank 1 says this server is shard 1 of 2, other workers said 0 of 1" in error_of(conn)


def test_a_rank_that_connects_its_lane_twice_is_refused_the_second_time():
    core = Core()
    first = core.worker(0)
    second = core.connect()
    core.hello(second, 0)
    assert "rank 0 connected lane 0 twice" in error_of(second)
    assert not first.closed and core.job.ended is None


def test_a_bad_frame_from_a_stranger_refuses_it_and_from_a_worker_fails_the_job():
    core = Core()
    stranger = core.connect()
    core.protocol.bad_frame(stranger, "bad magic")
    assert "protocol error: bad magic" in error_of(stranger)
    workers = core.ready_job()
    core.protocol.bad_frame(workers[1], "chunk 9 out of range")
    for conn in workers:
        assert "rank 1 (lane 0) sent a bad frame: chunk 9 out of range" in error_of(conn)
        assert conn.discarded  # queued results are dropped: the ERROR must get through
    assert core.protocol.finished and core.protocol.exit_status == 1
    assert core.job.state is None  # nothing reads a failed job's arrays again


def test_strangers_are_counted_per_address_and_dropped_after_the_handshake_deadline():
    core = Core()
    conns = [core.connect(address="198.18.0.9") for _ in range(MAX_PENDING_PER_ADDRESS)]
    assert "too many connections from 198.18.0.9" in core.protocol.refusal("198.18.0.9")
    assert core.protocol.refusal("198.18.0.10") is None
    core.clock.advance(HANDSHAKE_SECONDS + 1.5)
    core.protocol.tick()
    assert all(conn.closed for conn in conns) and core.protocol.strangers.pending == {}
    assert core.protocol.refusal("198.18.0.9") is None


# -- the job ----------------------------------------------------------------------------------
def test_rounds_give_the_closed_form_weights_to_every_worker():
    core = Core()
    conns = core.ready_job()
    weights = np.ones(SIZE, np.float32)
    for iteration in (1, 2, 3):
        grads = [np.full(SIZE, (rank + 1) * iteration, np.float32) for rank in range(2)]
        core.push(conns[0], 0, iteration, grads[0])
        assert conns[0].take() == [] and conns[1].take() == []  # the round waits for rank 1
        core.push(conns[1], 1, iteration, grads[1])
        weights = weights - LR * (grads[0] + grads[1])  # SGD on the sum (MXNet's rescale_grad = 1)
        for conn in conns:
            assert np.array_equal(results(conn)[iteration], weights)


def test_pushes_out_of_turn_are_refused():
    core = Core()
    conns = core.ready_job()
    grad = np.ones(SIZE, np.float32)
    refused(lambda: core.push(conns[0], 0, 2, grad), "expected 1")
    refused(lambda: core.push(conns[0], 1, 1, grad), "claims sender 1 on the connection of 0")
    core.push(conns[0], 0, 1, grad)
    refused(lambda: core.push(conns[0], 0, 1, grad), "twice in iteration 1")


def test_only_the_first_worker_sets_the_optimizer_and_without_rdma_it_is_not_echoed():
    core = Core()
    conns = core.ready_job(optimizer=None)
    refused(lambda: core.send(conns[1], wire.control_frame(K.OPTIMIZER, 0, 1, SGD(0.1).to_dict())),
            "only the first worker sets the optimizer")
    core.send(conns[0], wire.control_frame(K.OPTIMIZER, 0, 0, SGD(0.1).to_dict()))
    assert conns[0].take() == []  # TCP: the pushes travel behind it


def test_state_request_sends_each_chunk_s_momentum():
    core = Core()
    conns = core.ready_job(optimizer=SGD(learning_rate=LR, momentum=0.5))
    for rank, conn in enumerate(conns):
        core.push(conn, rank, 1, np.full(SIZE, 2.0, np.float32))
    conns[1].take()
    core.send(conns[1], wire.control_frame(K.STATE_REQUEST, 0, 1, {}))
    frames = conns[1].take()
    assert [(f.header.kind, f.header.chunk, f.header.iteration) for f in frames] == [(K.STATE, 0, 1), (K.STATE, 1, 1)]
    momentum = np.frombuffer(b"".join(bytes(f.payload) for f in frames), np.float32)
    assert np.array_equal(momentum, np.full(SIZE, -LR * 4.0, np.float32))  # MXNet's: mom = 0.5 * 0 - lr * sum


def test_share_goes_to_every_lane_0_worker_and_to_later_ones_on_welcome():
    core = Core(workers=3)
    first, second = core.worker(0), core.worker(1)
    core.send(first, wire.control_frame(K.SHARE, 0, 0, {"name": "port", "value": 29500}))
    for conn in (first, second):
        [frame] = conn.take()
        assert frame.header.kind is K.SHARE and frame.json() == {"name": "port", "value": 29500}
    late = core.connect()
    core.hello(late, 2)
    assert [f.header.kind for f in late.take()] == [K.WELCOME, K.SHARE]
    refused(lambda: core.send(first, wire.control_frame(K.SHARE, 0, 0, {"name": "port", "value": 1})),
            "'port' was shared already")
    refused(lambda: core.send(second, wire.control_frame(K.SHARE, 0, 1, {"name": "x", "value": 1})),
            "only rank 0 shares")


def test_shared_values_count_against_the_job_s_byte_budget_with_its_arrays():
    core = Core(workers=2, max_job_bytes=1 << 20)
    first, second = core.worker(0), core.worker(1)
    core.send(first, wire.control_frame(K.SHARE, 0, 0, {"name": "a", "value": "x" * 600_000}))
    refused(lambda: core.send(first, wire.control_frame(K.SHARE, 0, 0, {"name": "b", "value": "x" * 600_000})),
            "SHARE: 'b' needs", "--max-job-bytes")
    assert list(core.job.shared) == ["a"]
    refused(lambda: core.send(first, wire.control_frame(K.REGISTER, 0, 0, {"batch": 0, "arrays": [["w", 120_000]]})),
            "--max-job-bytes")  # 480 KB: it would fit alone, not beside the shared value


def test_every_connection_of_a_job_may_have_twice_what_the_job_holds_waiting_for_it():
    """A peer that lets more pile up is dropped (links.Link.limit_queue); the bound grows
    with what the job registers and shares."""
    core = Core()
    stranger = core.connect()
    slack = stranger.max_queued
    assert slack >= 2 * wire.MAX_CONTROL_BYTES
    conns = core.ready_job()
    held = core.job.registered_bytes
    assert held >= 4 * SIZE and all(conn.max_queued == slack + 2 * held for conn in conns)
    core.send(conns[0], wire.control_frame(K.SHARE, 0, 0, {"name": "a", "value": 1}))
    assert all(conn.max_queued == slack + 2 * (held + core.job.shared_bytes) for conn in conns)


# -- the end of a job -------------------------------------------------------------------------
def test_every_worker_saying_bye_ends_the_job_cleanly():
    core = Core()
    conns = core.ready_job()
    for rank, conn in enumerate(conns):
        core.push(conn, rank, 1, np.ones(SIZE, np.float32))
        assert not core.protocol.finished
        core.send(conn, wire.control_frame(K.BYE, 0, rank, {}))
    assert core.job.ended == "" and core.protocol.finished and core.protocol.exit_status == 0
    assert (core.job.state, core.job.links, core.job.shared) == (None, {}, {})  # what it held is let go
    for conn in conns:  # a clean close after BYE is no failure
        core.protocol.connection_lost(conn, "connection closed by peer", midframe=False)
    carried = 2 * 2 * SIZE * 4  # 2 workers pushed and pulled SIZE float32 once
    assert core.job.ended == "" and core.logs == [
        f"core 0: job 0 ended cleanly: 2 worker(s) pushed and pulled {carried} bytes through this core in 1 round(s)"]
    assert core.protocol.peers == {}


def test_a_worker_that_leaves_while_the_others_push_on_fails_the_job_naming_it():
    core = Core()
    conns = core.ready_job()
    core.send(conns[1], wire.control_frame(K.BYE, 0, 1, {}))
    core.push(conns[0], 0, 1, np.ones(SIZE, np.float32))
    message = error_of(conns[0])
    assert "worker 1 left the job" in message and "rank(s) [0] still push chunk 0 (iteration 1)" in message


AFTER_BYE = {
    "a push": lambda core, conn: core.push(conn, 2, 2, np.ones(SIZE, np.float32)),
    "a control frame": lambda core, conn: core.send(conn, wire.control_frame(K.STATE_REQUEST, 0, 2, {})),
    "a second BYE": lambda core, conn: core.send(conn, wire.control_frame(K.BYE, 0, 2, {})),
}


@pytest.mark.parametrize("late", AFTER_BYE.values(), ids=AFTER_BYE.keys())
def test_a_frame_after_a_worker_s_bye_is_refused_and_fails_the_job_naming_it(late):
    """A worker that said BYE is done: whatever it sends next would change the other workers'
    rounds. The core refuses it (what the core's loop hands to bad_frame) and the job fails."""
    core = Core(workers=3)
    conns = core.ready_job(workers=3)
    for rank, conn in enumerate(conns):
        core.push(conn, rank, 1, np.ones(SIZE, np.float32))
        conn.take()
    core.send(conns[2], wire.control_frame(K.BYE, 0, 2, {}))
    with pytest.raises(ProtocolError, match="after its BYE") as info:
        late(core, conns[2])
    core.protocol.bad_frame(conns[2], str(info.value))
    assert "rank 2 (lane 0) sent a bad frame" in error_of(conns[0]) and "after its BYE" in error_of(conns[0])
    assert core.job.ended


def test_the_c_loop_hands_a_push_after_bye_to_the_python_path():
    if drain_pushes is None:
        pytest.skip("the C extension phub._fastpath is not built")
    core = Core(workers=3)
    conns = core.ready_job(workers=3)
    core.send(conns[2], wire.control_frame(K.BYE, 0, 2, {}))
    push = wire.pack_header(K.PUSH, 0, 2, 0, 1, 1024) + np.ones(256, np.float32).tobytes()
    assert core.protocol.fast_pushes(conns[2], memoryview(bytearray(push)), 0, len(push)) == (0, True)
    assert core.job.state.owned[0].arrived == 0


def test_a_lost_worker_fails_the_job_and_every_other_connection_hears_why():
    core = Core(workers=3)
    conns = core.ready_job(workers=3)
    core.protocol.connection_lost(conns[2], "connection closed by peer", midframe=True)
    assert conns[2].closed and conns[2].finished_with is None  # nobody to tell
    for conn in conns[:2]:
        assert error_of(conn) == "job 0 failed: worker 2 lost: lane 0 connection closed by peer"
    assert (core.job.state, core.job.links, core.protocol.peers) == (None, {}, {})
    assert any("job 0 failed: worker 2 lost" in line for line in core.logs)
    late = core.connect()
    core.hello(late, 2)
    assert "job 0 has already ended" in error_of(late)


def test_a_worker_that_gives_up_fails_the_job_with_its_message():
    core = Core()
    conns = core.ready_job()
    core.send(conns[1], wire.control_frame(K.ERROR, 0, 1, {"message": "CUDA out of memory"}))
    assert error_of(conns[0]) == "job 0 failed: rank 1 gave up: CUDA out of memory"


def test_a_stalled_job_is_reported_then_failed_naming_who_it_waits_for():
    core = Core()
    conns = core.ready_job()
    core.push(conns[0], 0, 1, np.ones(SIZE, np.float32))
    core.clock.advance(TIMEOUT / 2 + 1)
    core.protocol.tick()
    assert core.logs[-1] == "core 0: job 0 has waited 31 s for rank(s) [1] to push chunk(s) 0, 1"
    core.clock.advance(1)
    core.protocol.tick()
    assert len(core.logs) == 1 and core.job.ended is None  # said once
    core.clock.advance(TIMEOUT / 2 - 1)
    core.protocol.tick()
    assert error_of(conns[1]) == "job 0 failed: stalled for 61 s waiting for rank(s) [1] to push chunk(s) 0, 1"


def test_workers_waiting_for_one_that_never_connects_hear_of_it_after_the_connect_timeout():
    """Not after a step's whole timeout: the job fails naming the missing rank, and the
    launcher hears (report_joins) that no worker of it is to blame."""
    core = Core(workers=3, connect_timeout=10, report_joins=True)
    conns = [core.worker(0)]
    core.clock.advance(5)
    conns.append(core.worker(1))
    for rank, conn in enumerate(conns):
        core.register(conn, rank)
    core.clock.advance(4.5)
    core.protocol.tick()
    assert core.job.ended is None
    core.clock.advance(0.5)  # 10 s after the first worker connected
    core.protocol.tick()
    message = "rank(s) [2] never connected within 10 s of the job's first worker (--connect-timeout); " \
              "the others waited for them"
    for conn in conns:
        assert error_of(conn) == f"job 0 failed: {message}"
    assert core.reports[-1] == {"event": "failed", "job": 0, "rank": None, "message": message}


def test_the_launcher_hears_which_worker_ended_the_job():
    core = Core(report_joins=True)
    conns = core.ready_job()
    core.send(conns[1], wire.control_frame(K.ERROR, 0, 1, {"message": "ValueError: bad"}))
    assert core.reports[-1] == {"event": "failed", "job": 0, "rank": 1, "message": "rank 1 gave up: ValueError: bad"}


def test_a_job_nobody_connects_to_ends_after_the_timeout_naming_the_ranks():
    core = Core(workers=2, first_rank=2, total_workers=4)
    core.clock.advance(TIMEOUT - 1)
    core.protocol.tick()
    assert core.job.ended is None and not core.protocol.finished
    core.clock.advance(1)
    core.protocol.tick()
    assert core.job.ended == "no worker connected within 60 s: rank(s) [2, 3] never did"
    assert core.protocol.finished and core.protocol.exit_status == 1


# -- two racks --------------------------------------------------------------------------------
RACK_PEERS = ("198.18.0.1+198.18.0.2:9000", "198.18.1.1+198.18.1.2:9100")  # two interfaces each
RACK_INTERFACES = (("198.18.0.1", "198.18.0.2"), ("198.18.1.1", "198.18.1.2"))


def rack_hello(rack, interface=0):
    return wire.control_frame(K.HELLO, 0, rack, {"job": 0, "token": TOKEN, "peer_rack": rack, "core": 0,
                                                 "interface": interface})


def test_a_rack_server_calls_the_higher_racks_and_a_lower_rack_may_not_pretend():
    core = Core(rack=0, port=9000, peers=("198.18.0.1:9000", "198.18.1.1:9100"))
    core.worker(0)
    [(address, source, link)] = core.opened
    assert (address, source) == (("198.18.1.1", 9100), "198.18.0.1")  # core 0 of rack 1, from our address
    [hello] = link.take()
    assert hello.header.kind is K.HELLO
    assert hello.json() == {"job": 0, "token": TOKEN, "peer_rack": 0, "core": 0, "interface": 0}
    stranger = core.connect()
    core.send(stranger, rack_hello(1))
    assert "unexpected rack server hello from rack 1" in error_of(stranger)  # rack 1 is called, it does not call


def test_a_rack_server_links_each_interface_to_the_same_interface_of_the_other_racks():
    core = Core(rack=0, port=9000, peers=RACK_PEERS, interfaces=RACK_INTERFACES[0])
    core.worker(0)
    assert [(address, source) for address, source, _ in core.opened] == \
        [(("198.18.1.1", 9100), "198.18.0.1"), (("198.18.1.2", 9100), "198.18.0.2")]
    assert [link.take()[0].json()["interface"] for _, _, link in core.opened] == [0, 1]


@pytest.mark.parametrize("says, arrives, source, error", [
    (1, 0, 1, "rack 0 says its link is interface 1's, but it arrived on interface 0 (198.18.1.1)"),
    (1, 1, 0, "rack 0's link for interface 1 comes from 198.18.0.1, not from that interface's address 198.18.0.2"),
    (2, 0, 0, "HELLO.interface = 2 is outside [0, 1]"),
    (None, 1, 1, "HELLO.interface must be an integer, got None"),
])
def test_a_rack_hello_on_the_wrong_or_an_unknown_interface_is_refused(says, arrives, source, error):
    """`arrives`: the interface whose listener took the link; `source`: the interface of rack 0
    whose address it came from."""
    core = Core(rack=1, port=9100, peers=RACK_PEERS, interfaces=RACK_INTERFACES[1])
    link = core.connect("rack 0", address=RACK_INTERFACES[0][source], interface=arrives)
    try:
        core.send(link, rack_hello(0, says))
    except ProtocolError as exc:  # a malformed HELLO: what the core's loop hands to bad_frame
        core.protocol.bad_frame(link, str(exc))
    assert error in error_of(link)
    assert core.job.ended is None  # a refused link is not the job's: the right one may still come


def test_a_rack_link_connected_twice_is_refused():
    core = Core(rack=1, port=9100, peers=RACK_PEERS, interfaces=RACK_INTERFACES[1])
    first, second = (core.connect("rack 0", address="198.18.0.2", interface=1) for _ in range(2))
    core.send(first, rack_hello(0, 1))
    core.send(second, rack_hello(0, 1))
    assert not first.closed
    assert "rack 0 connected core 0 / interface 1 twice" in error_of(second)


def test_losing_one_rack_link_fails_the_job_naming_the_link():
    core = Core(rack=0, port=9000, peers=RACK_PEERS, interfaces=RACK_INTERFACES[0], report_joins=True)
    worker = core.worker(0)
    [_, (_, _, second)] = core.opened
    core.protocol.connection_lost(second, "connection closed by peer", False)
    message = "rack 1's server lost (the link of core 0 / interface 1, 198.18.1.2): connection closed by peer"
    assert core.job.ended == message
    assert message in error_of(worker)
    assert core.reports[-1] == {"event": "failed", "job": 0, "rank": None, "message": message}


def test_a_rack_that_cannot_be_reached_fails_the_job_and_the_core_serves_on():
    core = Core(rack=0, port=9000, peers=("198.18.0.1:9000", "198.18.1.1:9100"))

    def unreachable(address, source):
        raise ConfigError("connection refused")

    core.protocol.open_connection = unreachable
    conn = core.connect()
    core.hello(conn, 0)
    assert "cannot reach rack 1's server at 198.18.1.1:9100 (interface 0, from 198.18.0.1): connection refused" \
        in error_of(conn)
    assert core.protocol.finished  # once: the only job has ended


@pytest.mark.parametrize("interfaces", [1, 2])
def test_partials_and_totals_of_two_racks_meet_in_the_same_weights(interfaces):
    """Two racks of one worker each; with two interfaces the worker's two lanes (one chunk each)
    are on two interfaces, and each chunk's partial and total travel on its own interface's link."""
    peers = tuple("+".join(addresses[:interfaces]) + f":{port}"
                  for addresses, port in zip(RACK_INTERFACES, (9000, 9100)))
    racks = [Core(workers=1, first_rank=r, total_workers=2, rack=r, port=(9000, 9100)[r], peers=peers,
                  interfaces=RACK_INTERFACES[r][:interfaces]) for r in range(2)]
    lower = racks[0]
    lanes = []  # per rack: the worker's connection on each lane (lane i is on interface i)
    for r, core in enumerate(racks):
        conns = [core.connect(f"rank {r} lane {lane}", interface=lane) for lane in range(interfaces)]
        for lane, conn in enumerate(conns):
            core.hello(conn, r, lane=lane)
            assert conn.take()[0].header.kind is K.WELCOME
        lanes.append(conns)
    links = []  # (rack 0's end, rack 1's end, interface)
    for interface, (address, source, up) in enumerate(lower.opened):
        assert (address[0], source) == (RACK_INTERFACES[1][interface], RACK_INTERFACES[0][interface])
        links.append((up, racks[1].connect(f"rack 0 on {interface}", address=source, interface=interface), interface))
    carried = {}  # interface -> chunk ids whose partials and totals crossed on it

    def pump():
        moved = True
        while moved:
            moved = False
            for up, down, interface in links:
                for data, into, conn in ((up, racks[1], down), (down, lower, up)):
                    sent, data.sent = b"".join(data.sent), []
                    if sent:
                        for frame in frames_of(sent):
                            if frame.header.kind in (K.PARTIAL, K.TOTAL):
                                carried.setdefault(interface, set()).add(frame.header.chunk)
                        into.send(conn, sent)
                        moved = True

    chunks = ((0, 256), (256, SIZE))  # chunk 0 on lane 0; with two lanes, chunk 1 on lane 1
    lane_of = [0, 1 if interfaces == 2 else 0]
    for r, core in enumerate(racks):
        for conn in lanes[r]:
            core.register(conn, r)
    for chunk, (start, end) in enumerate(chunks):
        lower.send(lanes[0][lane_of[chunk]], wire.pack_header(K.INIT, 0, 0, chunk, 0, 4 * (end - start))
                   + np.ones(end - start, np.float32).tobytes())
    pump()
    for r, core in enumerate(racks):
        for conn in lanes[r]:
            assert conn.take()[-1].header.kind is K.READY
            core.send(conn, wire.control_frame(K.OPTIMIZER, 0, r, SGD(learning_rate=LR).to_dict()))
    for r, core in enumerate(racks):
        for chunk, (start, end) in enumerate(chunks):
            core.send(lanes[r][lane_of[chunk]], wire.pack_header(K.PUSH, 0, r, chunk, 1, 4 * (end - start))
                      + np.full(end - start, 2.0 * (r + 1), np.float32).tobytes())
    pump()
    assert carried == {i: {c for c in range(2) if lane_of[c] == i} for i in range(interfaces)}
    expected = np.ones(SIZE, np.float32) - LR * (2.0 + 4.0)
    for r in range(2):
        by_chunk = {}
        for conn in lanes[r]:
            for frame in conn.take():
                assert frame.header.kind is K.RESULT and frame.header.iteration == 1, frame.header
                by_chunk[frame.header.chunk] = np.frombuffer(bytes(frame.payload), np.float32)
        assert np.array_equal(np.concatenate([by_chunk[0], by_chunk[1]]), expected), f"rack {r}"


def test_a_core_simulating_racks_links_each_interface_to_itself_and_refuses_strangers_there():
    core = Core(simulated_racks=3, interfaces=RACK_INTERFACES[0])
    core.worker(0)
    assert [(address, source) for address, source, _ in core.opened] == \
        [(("198.18.0.1", 9000), "198.18.0.1"), (("198.18.0.2", 9000), "198.18.0.2")]
    own = core.connect("itself", address="198.18.0.2", interface=1)
    core.send(own, rack_hello(0, 1))
    assert not own.closed and core.job.loop_ins == [own]
    stranger = core.connect("elsewhere", address="198.18.0.9", interface=1)
    core.send(stranger, rack_hello(0, 1))
    assert "must come from core 0 itself" in error_of(stranger) and "from 198.18.0.9" in error_of(stranger)
    assert core.job.ended is None


def test_rack_layouts_that_cannot_work_are_refused_naming_the_option():
    two = {"interfaces": RACK_INTERFACES[0], "port": 9000}
    with pytest.raises(ConfigError, match=r"rack 1's server '198.18.1.1:9100' lists 1 interface address\(es\), "
                                          r"this server has 2"):
        ServerConfig(peers=("198.18.0.1+198.18.0.2:9000", "198.18.1.1:9100"), **two)
    with pytest.raises(ConfigError, match="not IPv4-HOST"):
        ServerConfig(peers=("198.18.0.1+nohost:9000", "198.18.1.1+198.18.1.2:9100"), **two)
    with pytest.raises(ConfigError, match="does not go with --peers"):
        ServerConfig(peers=RACK_PEERS, simulated_racks=2, **two)
    with pytest.raises(ConfigError, match=r"--simulate-racks\) must be an integer in \[1, 64\]"):
        ServerConfig(simulated_racks=0)
    argv = ServerConfig(peers=RACK_PEERS, rack=1, **two).to_argv()
    assert argv[argv.index("--peers") + 1] == ",".join(RACK_PEERS)
    assert "--simulate-racks 3" in " ".join(ServerConfig(simulated_racks=3).to_argv())
