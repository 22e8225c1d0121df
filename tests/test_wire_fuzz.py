"""Property-based fuzzing of the frame parser with hypothesis: arbitrary bytes, and valid streams
with arbitrary mutations, fed in arbitrary pieces, never raise anything but ProtocolError and never
write outside the buffers the parser was given (guard bytes around every target stay intact)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phub.errors import ProtocolError
from phub.protocol.wire import MAGIC, VERSION, FrameReceiver
from test_wire import Target, feed, sample_stream

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parse(stream: bytes, sizes, scatter: bool) -> Target:
    target, got = Target(), []
    pieces = iter(sizes or [7])
    try:
        feed(FrameReceiver(target), stream, lambda: next(pieces, 13), got, scatter=scatter)
    except ProtocolError:
        pass
    for frame in got:  # a control payload may be bad JSON: that too only as ProtocolError
        try:
            frame.json()
        except ProtocolError:
            pass
    return target


@FUZZ
@given(st.binary(min_size=1, max_size=400), st.booleans(), st.lists(st.integers(1, 64), max_size=40),
       st.booleans())
def test_arbitrary_bytes(data, with_magic, sizes, scatter):
    stream = (MAGIC + bytes([VERSION]) + data) if with_magic else data
    assert _parse(stream, sizes, scatter).guards_intact()


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, 10**6),
                          st.binary(min_size=1, max_size=8)), min_size=1, max_size=6),
       st.lists(st.integers(1, 64), max_size=40), st.booleans())
def test_mutated_valid_streams(edits, sizes, scatter):
    frames, _ = sample_stream()
    stream = bytearray(b"".join(frames))
    for op, position, data in edits:
        i = position % len(stream)
        if op == "set":
            stream[i] = data[0]
        elif op == "insert":
            stream[i:i] = data
        elif len(stream) > len(data):
            del stream[i:i + len(data)]
    assert _parse(bytes(stream), sizes, scatter).guards_intact()
