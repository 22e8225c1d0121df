"""A worker's protocol (phub.protocol.worker.WorkerProtocol) driven without sockets: frames go in
as the bytes a server core would send; results must land where the worker awaits them, waiters
must wake, and every frame a server may not send must be refused naming it."""
import numpy as np
import pytest

from phub.protocol import wire
from phub.reduction.chunking import ChunkPlan, Topology
from phub.network.tcp import TcpWorkerPath
from phub.errors import JobFailed, PHubError, ProtocolError
from phub.client.handle import Handle
from phub.protocol.worker import ServerReportedError, WorkerProtocol
from phub.protocol.testing import feed, frame_of
from conftest import refused

K = wire.Kind
S = wire.SERVER_SENDER
CHUNK_BYTES = 1024


def worker(lanes=2):
    """Rank 1 of job 7, one array of 600 floats over 3 chunks on `lanes` lanes, all awaited in iteration 1."""
    protocol = WorkerProtocol(7, 1, 2, token="t")
    protocol.data = TcpWorkerPath(7, 1)
    plan = ChunkPlan(Topology(interfaces=lanes, cores=1), CHUNK_BYTES)
    plan.add_arrays([("w", (600,))])
    protocol.chunks_changed(plan)
    out = np.zeros(600, np.float32)
    handle = Handle(None, len(plan.chunks), out, "pushpull of 'w'", [c.id for c in plan.chunks])
    view = memoryview(out).cast("B")
    for c in plan.chunks:
        protocol.expect[c.id] = (view[c.offset * 4:(c.offset + c.size) * 4], [1, handle])
    return protocol, plan, out, handle


def receive(protocol, lane, data):
    feed(data, lambda header: protocol.payload_target(header, lane), lambda f: protocol.frame_received(lane, f))


def result(chunk, values, iteration=1, job=7):
    return wire.pack_header(K.RESULT, job, S, chunk.id, iteration, chunk.nbytes) + values.tobytes()


def test_the_handshake_says_who_it_is_and_reads_the_welcome_or_the_refusal():
    protocol = WorkerProtocol(7, 1, 2, token="t")
    hello = frame_of(protocol.hello(3, shard=0, shards=1))
    assert hello.header.kind is K.HELLO and hello.header.sender == 1 and hello.header.job == 7
    assert hello.json() == {"job": 7, "token": "t", "rank": 1, "num_workers": 2, "lane": 3, "shard": 0, "shards": 1}
    welcome = frame_of(wire.control_frame(K.WELCOME, 7, S, {"cores": 2}))
    assert protocol.welcome(welcome) == {"cores": 2}
    with pytest.raises(JobFailed, match="the server refused rank 1: wrong token"):
        protocol.welcome(frame_of(wire.control_frame(K.ERROR, 0, S, {"message": "wrong token"})))
    refused(lambda: protocol.welcome(frame_of(wire.control_frame(K.READY, 7, S, {"batch": 0}))),
            "expected WELCOME", "got READY")


def test_results_land_in_the_awaited_array_and_complete_the_handle():
    protocol, plan, out, handle = worker()
    for c in plan.chunks:
        assert not handle.done()
        receive(protocol, c.lane, result(c, np.full(c.size, c.id + 0.5, np.float32)))
    assert handle.done() and protocol.expect == {} and protocol.awaiting([0, 1, 2]) == []
    assert np.array_equal(out, np.concatenate([np.full(c.size, c.id + 0.5, np.float32) for c in plan.chunks]))


def test_a_keys_results_are_awaited_by_the_same_entries_while_they_go_into_the_same_array():
    """expect_key makes a key's entries once per output array: the next pushpull into it only
    changes the iteration and handle they share; another array gets entries of its own."""
    protocol = WorkerProtocol(7, 1, 2, token="t")
    plan = ChunkPlan(Topology(interfaces=2, cores=1), CHUNK_BYTES)
    plan.add_arrays([("w", (600,))])
    protocol.chunks_changed(plan)
    first, second = np.zeros(600, np.float32), np.zeros(600, np.float32)
    spans = plan.key_spans("w")
    seen = []
    for iteration, out in enumerate([first, first, second, first], start=1):
        handle = Handle(None, len(plan.chunks), out, f"pushpull {iteration}", [c.id for c in plan.chunks])
        protocol.expect_key("w", out, spans, iteration, handle)
        seen.append(dict(protocol.expect))
        for c in plan.chunks:
            receive(protocol, c.lane, result(c, np.full(c.size, iteration + c.id, np.float32), iteration=iteration))
        assert handle.done() and protocol.expect == {}
        assert np.array_equal(out, np.concatenate([np.full(c.size, iteration + c.id, np.float32) for c in plan.chunks]))
    assert all(seen[1][cid] is seen[0][cid] for cid in seen[0])  # the same array: the same entries
    assert all(seen[2][cid] is not seen[1][cid] for cid in seen[1])  # another array: new ones
    assert all(seen[3][cid] is not seen[1][cid] for cid in seen[1])  # and new ones back
    assert np.array_equal(second[:256], np.full(256, 3, np.float32))  # iteration 3 went to `second` only


@pytest.mark.parametrize("make, words", [
    (lambda c: result(c, np.zeros(c.size, np.float32), iteration=2), ["unexpected RESULT for chunk 0 iteration 2"]),
    (lambda c: result(c, np.zeros(c.size, np.float32), job=8), ["RESULT frame for job 8 on a connection of job 7"]),
    (lambda c: wire.pack_header(K.RESULT, 7, S, 9, 1, 16) + bytes(16), ["chunk 9", "chunks 0..2"]),
    (lambda c: wire.pack_header(K.RESULT, 7, S, 0, 1, 16) + bytes(16), ["has 16 payload bytes"]),
    (lambda c: wire.pack_header(K.RESULT, 7, 3, 0, 1, c.nbytes) + bytes(c.nbytes), ["claims sender 3"]),
    (lambda c: wire.pack_header(K.PUSH, 7, S, 0, 1, c.nbytes) + bytes(c.nbytes), ["the server sent a PUSH data frame"]),
    (lambda c: wire.control_frame(K.WELCOME, 7, S, {}), ["unexpected WELCOME frame"]),
    (lambda c: wire.control_frame(K.OPTIMIZER, 7, S, {}), ["unexpected OPTIMIZER frame"]),  # TCP: never echoed
    (lambda c: wire.control_frame(K.READY, 7, S, {"batch": 5}), ["READY for batch 5"]),
    (lambda c: wire.control_frame(K.READY, 7, S, {"batch": "0"}), ["READY.batch must be an integer"]),
    (lambda c: wire.control_frame(K.SHARE, 7, S, {"name": ""}), ["SHARE.name must not be empty"]),
])
def test_what_a_server_may_not_send_is_refused_before_it_lands(make, words):
    protocol, plan, out, handle = worker()
    refused(lambda: receive(protocol, 0, make(plan.chunks[0])), *words)
    assert not out.any() and not handle.done()


def test_a_result_on_a_lane_that_does_not_carry_its_chunk_is_refused():
    protocol, plan, out, _ = worker(lanes=2)
    chunk = plan.chunks[0]
    other = 1 - chunk.lane
    refused(lambda: receive(protocol, other, result(chunk, np.ones(chunk.size, np.float32))),
            f"chunk {chunk.id}, which this connection does not carry")
    assert not out.any()


def test_ready_counts_per_lane_and_share_files_the_value_and_wakes_its_waiter():
    protocol, _, _, _ = worker()
    ready = protocol.ready_waiters[0] = Handle(None, 2, None, "init of batch 0", [])
    receive(protocol, 0, wire.control_frame(K.READY, 7, S, {"batch": 0}))
    assert not ready.done()
    receive(protocol, 1, wire.control_frame(K.READY, 7, S, {"batch": 0}))
    assert ready.done()
    waiter = protocol.share_waiters["port"] = Handle(None, 1, None, "share of 'port'", [])
    receive(protocol, 0, wire.control_frame(K.SHARE, 7, S, {"name": "port", "value": [29500, "x"]}))
    assert waiter.done() and protocol.shared == {"port": [29500, "x"]}
    receive(protocol, 0, wire.control_frame(K.SHARE, 7, S, {"name": "early", "value": 1}))  # asked for later
    assert protocol.shared["early"] == 1


def test_state_answers_land_where_optimizer_state_waits():
    protocol, plan, _, _ = worker()
    states = np.zeros(600, np.float32)
    handle = Handle(None, len(plan.chunks), states, "optimizer_state", [])
    view = memoryview(states).cast("B")
    for c in plan.chunks:
        protocol.expect_state[c.id] = (view[c.offset * 4:(c.offset + c.size) * 4], handle)
    for c in plan.chunks:
        receive(protocol, c.lane, wire.pack_header(K.STATE, 7, S, c.id, 3, c.nbytes)
                + np.full(c.size, -1.0, np.float32).tobytes())
    assert handle.done() and np.array_equal(states, np.full(600, -1.0, np.float32))
    refused(lambda: receive(protocol, 0, wire.pack_header(K.STATE, 7, S, 0, 3, plan.chunks[0].nbytes)
                            + bytes(plan.chunks[0].nbytes)), "unexpected STATE for chunk 0")


def test_an_error_frame_is_raised_with_its_message_and_fail_wakes_every_waiter():
    protocol, _, _, handle = worker()
    ready = protocol.ready_waiters[0] = Handle(None, 1, None, "init", [])
    with pytest.raises(ServerReportedError, match="job 7 failed: worker 0 lost"):
        receive(protocol, 0, wire.control_frame(K.ERROR, 7, S, {"message": "job 7 failed: worker 0 lost"}))
    assert protocol.error is None  # the I/O loop decides the cause (it may read the other lanes first)
    protocol.fail(JobFailed("lost the phub server"))
    protocol.fail(PHubError("a later error"))
    assert str(protocol.error) == "lost the phub server" and handle.done() and ready.done()
    assert isinstance(ServerReportedError("x"), JobFailed) and not isinstance(ServerReportedError("x"), ProtocolError)


@pytest.mark.parametrize("memory", ["new", "the same"])
def test_a_keys_pushes_are_its_chunks_frames_per_lane_in_order_with_each_pushpulls_iteration(memory):
    """The TCP path lays a key's headers out once and rewrites only their iteration, and keeps
    its items while the gradient comes from the same memory: every pushpull must still send
    exactly pack_header + the chunk's bytes as they are now, in chunk order per lane."""
    plan = ChunkPlan(Topology(interfaces=3, cores=1), CHUNK_BYTES)
    plan.add_arrays([("w", (1500,)), ("b", (10,))])
    path, links = TcpWorkerPath(7, 1), ["link0", "link1", "link2"]
    for key in ("w", "b"):
        chunks = plan.key_chunks(key)
        grad = np.empty(plan.key_size(key), dtype=np.float32)
        for iteration in (1, 2, 70000, 70001):
            if memory == "new":
                grad = np.empty(plan.key_size(key), dtype=np.float32)
            grad[:] = np.arange(plan.key_size(key), dtype=np.float32) * np.float32(iteration)
            data = memoryview(grad).cast("B")
            sent = {link: [bytes(part) for part in parts] for link, *parts in path.pushes(links, chunks, iteration, data)}
            want = {}
            for c in chunks:
                want.setdefault(links[c.lane], []).extend(
                    [wire.pack_header(K.PUSH, 7, 1, c.id, iteration, c.nbytes), grad[c.offset:c.offset + c.size].tobytes()])
            assert sent == want
