"""Tests for phub.transport: Links move frames in order, zero-copy into their targets, whether
sends are batched through an outbox (and cut short by a full socket buffer) or sent at once."""
import collections
import selectors
import socket

import numpy as np
import pytest

from phub.errors import ProtocolError
from phub.transport import Link, _consume, flush_links
from phub.wire import Kind, pack_header

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
        taken = min(sent, sum(map(len, batch)))
        _consume(outq, taken, batch)
        assert b"".join(bytes(p) for p in outq) == b"".join(bytes(p) for p in parts)[taken:]
