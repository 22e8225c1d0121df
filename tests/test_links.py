"""Tests for phub.network.links: Links move frames in order, zero-copy into their targets, whether
sends are batched through an outbox (and cut short by a full socket buffer) or sent at once."""
import collections
import selectors
import socket
import struct

import numpy as np
import pytest

from phub.errors import ProtocolError
from phub.network import links
from phub.network.links import Link, _consume, flush_links, send_queued_python
from phub.protocol.wire import Kind, pack_header

CHUNK_BYTES = 32768


def tcp_pair():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


def no_data(header):
    raise ProtocolError(f"unexpected {header.kind.name} data frame")


@pytest.mark.parametrize("batched", [True, False], ids=["outbox", "at once"])
def test_frames_arrive_in_order_and_in_place(batched):
    chunks = 300  # ~10 MB: more than the socket buffers hold, so sends are cut short
    rng = np.random.default_rng(1)
    source = rng.standard_normal((chunks, CHUNK_BYTES // 4)).astype(np.float32)
    dest = np.zeros_like(source)
    selector, outbox, got = selectors.DefaultSelector(), [], []
    a, b = tcp_pair()
    sender = Link(a, selector, no_data, lambda link, frame: None, outbox if batched else None)
    receiver = Link(b, selector, lambda header: memoryview(dest[header.chunk]).cast("B"),
                    lambda link, frame: got.append(frame), outbox)
    try:
        for chunk in range(chunks):
            sender.send(pack_header(Kind.PUSH, 0, 0, chunk, 1, CHUNK_BYTES), memoryview(source[chunk]).cast("B"))
            if chunk % 7 == 0:  # an empty control frame right behind a payload
                sender.send(pack_header(Kind.READY, 0, 0, chunk, 0, 0))
        sender.send(pack_header(Kind.BYE, 0, 0, 0, 0, 0))
        flush_links(outbox)
        assert sender.outq  # the socket buffers are full: the rest waits for EVENT_WRITE
        while not got or got[-1].header.kind is not Kind.BYE:
            events = selector.select(timeout=5)
            assert events, "stalled"
            for key, mask in events:
                key.data.service(mask)
            flush_links(outbox)
        assert not sender.outq
        pushes = [f for f in got if f.header.kind is Kind.PUSH]
        assert [f.header.chunk for f in pushes] == list(range(chunks))
        assert [f.header.chunk for f in got if f.header.kind is Kind.READY] == list(range(0, chunks, 7))
        assert np.array_equal(dest, source)
        dest[5, 0] = 42.0  # the payloads are views of the targets: no copy in between
        assert np.frombuffer(pushes[5].payload, np.float32)[0] == 42.0
    finally:
        sender.close()
        receiver.close()


@pytest.mark.parametrize("batch_is", ["the whole queue", "its first parts"])
def test_what_a_send_took_leaves_the_queue_and_a_part_cut_short_leaves_its_tail(batch_is):
    parts = [b"header", memoryview(bytearray(b"payload-one")), b"h2", bytearray(b"payload-two")]
    for sent in range(sum(map(len, parts)) + 1):
        outq = collections.deque(parts)
        batch = outq if batch_is == "the whole queue" else parts[:3]
        whole = sum(map(len, batch))
        taken = min(sent, whole)
        _consume(outq, taken, batch, whole)
        assert b"".join(bytes(p) for p in outq) == b"".join(bytes(p) for p in parts)[taken:]


SENDERS = [pytest.param(send_queued_python, id="python")]
if links.send_queued is not send_queued_python:
    SENDERS.append(pytest.param(links.send_queued, id="C"))


def mixed_parts(count: int, rng) -> list:
    """Parts of every kind a link queues: headers as bytes, payloads as views, odd and empty ones."""
    parts = []
    for i in range(count):
        payload = rng.integers(0, 256, int(rng.integers(0, 70000)), dtype=np.uint8)
        kind = i % 4
        parts.append(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
        parts.append(memoryview(payload) if kind == 0 else bytearray(payload) if kind == 1 else
                     payload.tobytes() if kind == 2 else memoryview(payload)[: int(rng.integers(0, 3))])
    return parts


@pytest.mark.parametrize("send_queued", SENDERS)
def test_a_queue_goes_out_whole_and_in_order_across_full_sockets(send_queued):
    parts = mixed_parts(400, np.random.default_rng(7))  # ~14 MB, far more than the socket holds
    expected = b"".join(bytes(p) for p in parts)
    a, b = tcp_pair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    a.setblocking(False)
    outq, received, full = collections.deque(parts), bytearray(), 0
    try:
        while True:
            drained = send_queued(a.fileno(), outq)
            left = b"".join(bytes(p) for p in outq)
            assert expected.endswith(left)  # what left the queue is exactly its front
            if drained:
                assert not outq
                break
            full += 1
            received += b.recv(1 << 20)  # make room (blocks until some bytes are there)
        a.close()
        while True:
            data = b.recv(1 << 20)
            if not data:
                break
            received += data
        assert full > 0  # the socket filled up: the cut-short path ran
        assert received == expected
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("send_queued", SENDERS)
def test_a_reset_connection_raises_and_the_queue_keeps_what_was_not_sent(send_queued):
    a, b = tcp_pair()
    a.setblocking(False)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    b.close()  # with a zero linger: a reset, which loopback delivers before close returns
    parts = [b"header", memoryview(b"payload")]
    outq = collections.deque(parts)
    with pytest.raises(ConnectionResetError):
        send_queued(a.fileno(), outq)
    assert list(outq) == parts
    a.close()


def test_a_peer_that_lets_more_than_the_bound_pile_up_is_dropped_saying_why():
    """A bounded link whose peer does not read: once more than the bound waits, what waits is
    dropped, the selector reports the link and reading it raises LinkClosed naming the cause.
    Below the bound, or without one, everything waits."""
    selector = selectors.DefaultSelector()
    a, b = tcp_pair()
    link = Link(a, selector, no_data, lambda link, frame: None, [])
    payload = memoryview(bytes(CHUNK_BYTES))
    try:
        link.limit_queue(4 << 20)
        sent = 0
        while link.overflow is None and sent < 64 << 20:  # the socket buffers fill first, then the queue
            link.send(pack_header(Kind.RESULT, 0, 0, 0, 1, CHUNK_BYTES), payload)
            link.flush()
            sent += CHUNK_BYTES
        assert link.overflow is not None and "more than 4194304 bytes waited" in link.overflow
        assert not link.outq and sent < 64 << 20
        link.send(b"more")  # ignored: the link is being dropped
        assert not link.outq
        [(key, _)] = selector.select(timeout=5)  # the owner's loop hears of it without the peer
        with pytest.raises(links.LinkClosed, match="stopped reading what it is sent") as info:
            key.data.service(selectors.EVENT_READ)
        assert info.value.midframe
    finally:
        link.close()
        b.close()


def test_a_closed_link_frees_what_waited_for_it():
    selector = selectors.DefaultSelector()
    a, b = tcp_pair()
    link = Link(a, selector, no_data, lambda link, frame: None, [])
    payload = bytes(CHUNK_BYTES)
    for _ in range(1000):  # 32 MB: more than the socket buffers take
        link.send(pack_header(Kind.RESULT, 0, 0, 0, 1, CHUNK_BYTES), payload)
        link.flush()
    assert link.outq
    link.close()
    b.close()
    assert not link.outq
