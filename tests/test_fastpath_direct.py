"""The worker's C direct reader (phub/_fastpath_direct.h) and the direct link it reads for.

recv_results must read each expected RESULT straight into the caller's array (the same checks as
drain_results) and stop at the header of every frame it does not take, leaving it in the cursor
for the Python path. However the network cuts the bytes, a frame is read whole, once; a
connection closed mid-frame says so.
"""
import select
import selectors
import threading
import time

import numpy as np
import pytest

from phub.network import links
from phub.protocol import wire
from phub.network.links import DirectLink, LinkClosed
from test_fastpath import Counter
from test_links import tcp_pair

fastpath = pytest.importorskip("phub._fastpath", reason="the C extension phub._fastpath is not built")

HEADER = wire.HEADER_BYTES


def cursor():
    return bytearray(fastpath.CURSOR_BYTES)


def header_got(cur: bytearray) -> int:
    return int.from_bytes(cur[0:4], "little")


def payload_got(cur: bytearray) -> int:
    return int.from_bytes(cur[4:8], "little")


def until(sock, read, done, seconds=10.0):
    """Call `read()` whenever `sock` is readable until `done(result)`; the last result."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        select.select([sock], [], [], 1.0)
        result = read()
        if done(result):
            return result
    raise AssertionError("the reader did not get there in time")


@pytest.fixture
def pair():
    a, b = tcp_pair()
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_the_read_codes_are_the_c_readers():
    assert (links.READ_WOULD_BLOCK, links.READ_FOREIGN, links.READ_CLOSED,
            links.READ_STALE) == (0, 1, 2, 3)
    assert links.CURSOR_BYTES == fastpath.CURSOR_BYTES == 8 + 2 * HEADER


def result_frame(cid, values, iteration=4):
    data = np.asarray(values, np.float32).tobytes()
    return wire.pack_header(wire.Kind.RESULT, 0, wire.SERVER_SENDER, cid, iteration, len(data)) + data


def test_recv_results_reads_expected_results_into_place_and_stops_at_the_rest(pair):
    a, b = pair
    table = np.array([[0, 16], [1, 16], [0, 8]], dtype=np.int32)
    out = np.zeros(10, np.float32)
    view = memoryview(out).cast("B")
    handle = Counter(2)
    good = result_frame(0, [1, 2, 3, 4]) + result_frame(2, [5, 6])
    for bad in (result_frame(1, [7, 8, 9, 10]),  # lane 1's chunk on lane 0's connection
                result_frame(0, [1, 2, 3, 4]),  # no longer expected
                result_frame(2, [5, 6], iteration=5),
                wire.control_frame(wire.Kind.READY, 0, wire.SERVER_SENDER, {})):
        out[:] = 0
        handle.left = 2
        expect = {0: (view[0:16], [4, handle]), 2: (view[16:24], [4, handle]), 1: (view[24:40], [4, handle])}
        a.sendall(good + bad)
        cur = cursor()
        code = until(b, lambda: fastpath.recv_results(b.fileno(), cur, 0, 0, table, expect),
                     lambda r: r != links.READ_WOULD_BLOCK)
        assert code == links.READ_FOREIGN and bytes(cur[8:8 + HEADER]) == bad[:HEADER]
        assert out[:6].tolist() == [1, 2, 3, 4, 5, 6] and handle.left == 0 and set(expect) == {1}
        assert b.recv(len(bad)) == bad[HEADER:]


def test_recv_results_says_when_a_result_stopped_being_expected_mid_way(pair):
    a, b = pair
    table = np.array([[0, 4096]], dtype=np.int32)
    out = np.zeros(1024, np.float32)
    expect = {0: (memoryview(out).cast("B"), [1, Counter(1)])}
    frame = result_frame(0, np.arange(1024), iteration=1)
    cur = cursor()
    a.sendall(frame[:HEADER + 64])
    until(b, lambda: fastpath.recv_results(b.fileno(), cur, 0, 0, table, expect), lambda r: payload_got(cur) == 64)
    expect.clear()  # the client failed the job meanwhile
    a.sendall(frame[HEADER + 64:])
    select.select([b], [], [], 5.0)
    assert fastpath.recv_results(b.fileno(), cur, 0, 0, table, expect) == links.READ_STALE


def read_results(sock, cur, table, expect):
    return fastpath.recv_results(sock.fileno(), cur, 0, 0, table, expect)


def test_recv_results_takes_a_frame_cut_anywhere(pair):
    """A header and a payload cut in pieces: nothing lands until the frame is whole, and then
    exactly the payload, at its place."""
    a, b = pair
    values = np.arange(1024, dtype=np.float32) + 0.5
    table = np.array([[0, 4096]], dtype=np.int32)
    out = np.full(1026, -1.0, np.float32)
    handle = Counter(1)
    expect = {0: (memoryview(out).cast("B")[4:4100], [1, handle])}
    frame = result_frame(0, values, iteration=1)
    cur = cursor()
    cuts = [0, 5, HEADER, HEADER + 7, len(frame) - 1, len(frame)]
    for start, end in zip(cuts, cuts[1:]):
        a.sendall(frame[start:end])
        code = until(b, lambda: read_results(b, cur, table, expect),
                     lambda r: header_got(cur) + payload_got(cur) == end % len(frame) and (end < len(frame) or not expect))
        assert code == links.READ_WOULD_BLOCK and handle.left == (end < len(frame))
    assert out[1:-1].tolist() == values.tolist() and out[0] == out[-1] == -1


@pytest.mark.parametrize("cut", [0, 10, HEADER + 10], ids=["between frames", "in a header", "in a payload"])
def test_recv_results_reports_a_closed_connection_and_where(cut, pair):
    a, b = pair
    table = np.array([[0, 4096]], dtype=np.int32)
    expect = {0: (memoryview(np.zeros(1024, np.float32)).cast("B"), [1, Counter(1)])}
    a.sendall(result_frame(0, np.arange(1024), iteration=1)[:cut])
    a.close()
    cur = cursor()
    code = until(b, lambda: read_results(b, cur, table, expect), lambda r: r != links.READ_WOULD_BLOCK)
    assert code == links.READ_CLOSED and (header_got(cur) + payload_got(cur) > 0) == (cut > 0) and expect


@pytest.mark.parametrize("pieces", [7, 4096, 100_000], ids=lambda n: f"{n}-byte pieces")
def test_a_direct_link_delivers_every_frame_however_the_bytes_are_cut(pieces):
    """Control frames between results the C reader takes, a control frame larger than any read,
    a result the Python path must name, and a connection closed mid-frame at the end."""
    table = np.array([[0, 4096], [0, 4096], [0, 4096]], dtype=np.int32)
    out = np.zeros((3, 1024), np.float32)
    handle = Counter(2)
    expect = {cid: (memoryview(out[cid]).cast("B"), [1, handle]) for cid in (0, 1)}
    values = [np.arange(1024, dtype=np.float32) * (cid + 1) for cid in range(3)]
    frames = [wire.control_frame(wire.Kind.READY, 0, wire.SERVER_SENDER, {"n": 1}),
              result_frame(0, values[0], iteration=1),
              wire.control_frame(wire.Kind.SHARE, 0, wire.SERVER_SENDER, {"pad": "x" * 300_000}),
              result_frame(1, values[1], iteration=1),
              result_frame(2, values[2], iteration=1),  # not expected: the Python path takes it
              result_frame(0, values[0], iteration=2)[:HEADER + 3]]
    stream = b"".join(frames)
    selector, got, python = selectors.DefaultSelector(), [], []

    def target(header):
        python.append(header.chunk)
        return memoryview(out[header.chunk]).cast("B")

    a, b = tcp_pair()
    link = DirectLink(b, selector, target, lambda _, frame: got.append(frame), None,
                      lambda link, fd, cur: fastpath.recv_results(fd, cur, 0, 0, table, expect))

    def send():
        for i in range(0, len(stream), pieces):
            a.sendall(stream[i:i + pieces])
        a.close()

    sender = threading.Thread(target=send)
    try:
        sender.start()
        deadline, closed = time.monotonic() + 30, None
        while closed is None and time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                try:
                    link.on_readable()
                except LinkClosed as exc:
                    closed = exc
        assert [f.header.kind for f in got] == [wire.Kind.READY, wire.Kind.SHARE, wire.Kind.RESULT]
        assert len(got[1].payload) == len(frames[2]) - HEADER and got[2].header.chunk == 2
        assert python == [2, 0] and handle.left == 0 and expect == {}  # 0: its next round, not expected
        assert [row.tolist() for row in out] == [v.tolist() for v in values]
        assert closed is not None and closed.midframe  # the last result was cut short
    finally:
        sender.join(30)
        link.close()
