"""Tests for phub.protocol.wire: the header layout and its checks, the per-connection sender and chunk
checks, and FrameReceiver (split-invariant parsing, zero-copy data payloads, rejection before any
payload byte lands, and fuzzing with guard bytes around the payload buffers)."""
import json
import random
import struct

import numpy as np
import pytest

from phub.errors import ProtocolError
from phub.protocol.wire import (DATA_KINDS, HEADER_BYTES, MAX_CONTROL_BYTES, SERVER_SENDER, FrameReceiver, Header, Kind,
                                check_chunk, check_sender, control_frame, decode_header, decode_json, pack_header)

LAYOUT = struct.Struct("<4sBBHIIIIII")  # the documented header layout, written out independently
U32 = 0xFFFFFFFF


def raw_header(kind=Kind.PUSH, job=1, sender=0, chunk=0, iteration=0, length=0, flags=0, magic=b"PHUB", version=1):
    return LAYOUT.pack(magic, version, int(kind), flags, job, sender, chunk, iteration, length, 0)


# ------------------------------------------------------------------------------------------------
# Headers


@pytest.mark.parametrize("kind", list(Kind))
def test_header_round_trips_for_every_kind(kind):
    rng = random.Random(int(kind))
    for _ in range(50):
        limit = U32 if kind in DATA_KINDS else MAX_CONTROL_BYTES
        fields = dict(job=rng.randint(0, U32), sender=rng.choice([0, 5, SERVER_SENDER, rng.randint(0, U32)]),
                      chunk=rng.randint(0, U32), iteration=rng.randint(0, U32), length=rng.randint(0, limit),
                      flags=rng.randint(0, 0xFFFF))
        raw = pack_header(kind, **fields)
        assert len(raw) == HEADER_BYTES == 32
        assert raw == raw_header(kind, **fields)
        header = decode_header(raw)
        assert header == Header(kind, **fields) and header.kind is kind
        assert header.pack() == raw
        assert decode_header(bytearray(raw)) == decode_header(memoryview(raw)) == header


def test_length_limit_applies_to_control_frames_only():
    for kind in Kind:
        assert decode_header(raw_header(kind, length=MAX_CONTROL_BYTES)).length == MAX_CONTROL_BYTES
        if kind in DATA_KINDS:
            assert decode_header(raw_header(kind, length=U32)).length == U32
        else:
            with pytest.raises(ProtocolError, match=f"{kind.name} frame of {MAX_CONTROL_BYTES + 1} bytes exceeds"):
                decode_header(raw_header(kind, length=MAX_CONTROL_BYTES + 1))


@pytest.mark.parametrize(
    "raw, message",
    [
        (raw_header(magic=b"XHUB"), "bad magic"),
        (raw_header(magic=b"GET "), "not a phub peer"),
        (raw_header(version=0), "version 0 is not supported"),
        (raw_header(version=2), "version 2 is not supported"),
        (raw_header(kind=0), "unknown frame kind 0"),
        (raw_header(kind=max(Kind) + 1), f"unknown frame kind {max(Kind) + 1}"),
        (raw_header(kind=255), "unknown frame kind 255"),
        (raw_header()[:31], "a header is 32 bytes, got 31"),
        (raw_header() + b"\0", "a header is 32 bytes, got 33"),
        (b"", "a header is 32 bytes, got 0"),
    ],
)
def test_decode_header_rejections(raw, message):
    with pytest.raises(ProtocolError, match=message):
        decode_header(raw)


def test_decode_json():
    header = decode_header(raw_header(Kind.REGISTER))
    assert decode_json(header, b'{"a": [1, 2]}') == {"a": [1, 2]}
    frame = control_frame(Kind.ERROR, 3, 1, {"message": "boom"})
    assert decode_header(frame[:32]) == Header(Kind.ERROR, 3, 1, 0, 0, len(frame) - 32)
    assert json.loads(frame[32:]) == {"message": "boom"}
    for payload, message in [(b"[1]", "must carry a JSON object, got list"), (b"{", "invalid JSON"),
                             (b"\xff\xfe\xfa", "invalid JSON"), (b"", "invalid JSON"),
                             (b"[" * 100000, "invalid JSON"), (b'{"a":' * 100000, "invalid JSON")]:
        with pytest.raises(ProtocolError, match=f"REGISTER frame.*{message}"):
            decode_json(header, payload)


# ------------------------------------------------------------------------------------------------
# Per-connection checks


def test_check_sender():
    push = decode_header(raw_header(Kind.PUSH, job=7, sender=2))
    check_sender(push, job=7, sender=2, num_workers=3)
    check_sender(push, job=7, sender=2)
    with pytest.raises(ProtocolError, match="job 8 on a connection of job 7"):
        check_sender(decode_header(raw_header(job=8, sender=2)), job=7, sender=2, num_workers=3)
    with pytest.raises(ProtocolError, match="rank 3, outside the job's 3 workers"):
        check_sender(decode_header(raw_header(job=7, sender=3)), job=7, sender=3, num_workers=3)
    with pytest.raises(ProtocolError, match="claims sender 1 on the connection of 2"):
        check_sender(decode_header(raw_header(job=7, sender=1)), job=7, sender=2, num_workers=3)
    result = decode_header(raw_header(Kind.RESULT, job=7, sender=SERVER_SENDER))
    check_sender(result, job=7, sender=SERVER_SENDER, num_workers=3)
    with pytest.raises(ProtocolError, match="claims sender"):
        check_sender(result, job=7, sender=0, num_workers=3)


def test_check_chunk():
    nbytes = [32768, 32768, 4]
    allowed = lambda chunk: chunk != 1  # noqa: E731
    check_chunk(decode_header(raw_header(chunk=0, length=32768)), nbytes, allowed)
    check_chunk(decode_header(raw_header(chunk=2, length=4)), nbytes, allowed)
    for chunk, length, message in [(3, 4, "chunk 3, but the plan has chunks 0..2"),
                                   (U32, 4, f"chunk {U32}, but the plan"),
                                   (1, 32768, "chunk 1, which this connection does not carry"),
                                   (2, 8, "chunk 2 has 8 payload bytes, the plan says 4"),
                                   (0, 0, "chunk 0 has 0 payload bytes, the plan says 32768")]:
        with pytest.raises(ProtocolError, match=f"PUSH frame for {message}"):
            check_chunk(decode_header(raw_header(chunk=chunk, length=length)), nbytes, allowed)
    with pytest.raises(ProtocolError, match="plan has chunks"):
        check_chunk(decode_header(raw_header(chunk=0, length=4)), [], allowed)


# ------------------------------------------------------------------------------------------------
# FrameReceiver

NBYTES = [64, 4, 32, 8]  # chunk 3 is not carried by this connection
GUARD = 0xA5


class Target:
    """Payload buffers of every chunk inside one array, each surrounded by guard bytes."""

    def __init__(self):
        self.offsets, position = [], 16
        for n in NBYTES:
            self.offsets.append(position)
            position += n + 16
        self.array = np.full(position, GUARD, dtype=np.uint8)
        self.views = []  # every view handed out, in order

    def __call__(self, header):
        check_chunk(header, NBYTES, lambda chunk: chunk != 3)
        start = self.offsets[header.chunk]
        view = memoryview(self.array)[start:start + header.length]
        self.views.append(view)
        return view

    def region(self, chunk):
        return self.array[self.offsets[chunk]:self.offsets[chunk] + NBYTES[chunk]]

    def guards_intact(self):
        mask = np.ones(len(self.array), dtype=bool)
        for chunk in range(len(NBYTES)):
            mask[self.offsets[chunk]:self.offsets[chunk] + NBYTES[chunk]] = False
        return bool(np.all(self.array[mask] == GUARD))


def data_frame(kind, chunk, payload, iteration=0):
    return pack_header(kind, 1, 0, chunk, iteration, len(payload)) + payload


def sample_stream():
    rng = np.random.default_rng(0)
    payloads = {c: rng.standard_normal(NBYTES[c] // 4).astype(np.float32).tobytes() for c in range(3)}
    frames = [
        control_frame(Kind.HELLO, 1, 0, {"job": 1, "rank": 0, "lane": 2}),
        data_frame(Kind.PUSH, 0, payloads[0], iteration=4),
        pack_header(Kind.BYE, 1, 0, 0, 0, 0),  # zero-length control frame
        data_frame(Kind.INIT, 1, payloads[1]),
        control_frame(Kind.REGISTER, 1, 0, {"batch": 0, "arrays": [["w", 24]]}),
        pack_header(Kind.READY, 1, 0, 0, 0, 0),
        data_frame(Kind.RESULT, 2, payloads[2], iteration=9),
    ]
    return frames, payloads


def feed(receiver, stream, step, frames=None, scatter=False):
    """Write `stream` into the receiver's buffers, at most step() bytes per call, as a transport
    would (`scatter`: across `buffers()`, like recvmsg_into, handling every frame completed before
    receiving more); return the frames (also appended to `frames`) and (bytes consumed,
    receiver.idle) after every call."""
    frames = [] if frames is None else frames
    idles, position = [], 0
    assert receiver.idle
    while position < len(stream):
        buffers = receiver.buffers() if scatter else [receiver.buffer()]
        assert buffers and all(len(buf) > 0 for buf in buffers)
        n = min(sum(map(len, buffers)), step(), len(stream) - position)
        written = 0
        for buf in buffers:
            k = min(len(buf), n - written)
            buf[:k] = stream[position + written:position + written + k]
            written += k
        position += n
        frame = receiver.received(n)
        while frame is not None:
            frames.append(frame)
            frame = receiver.received(0)
        idles.append((position, receiver.idle))
    return frames, idles


STEPS = {"byte by byte": lambda rng: (lambda: 1), "all at once": lambda rng: (lambda: 1 << 30)}
STEPS.update({f"random splits {s}": (lambda s: lambda rng: (lambda: rng.randint(1, 40)))(s) for s in range(8)})


@pytest.mark.parametrize("scatter", [False, True], ids=["buffer", "buffers"])
@pytest.mark.parametrize("how", list(STEPS))
def test_receiver_yields_the_same_frames_however_the_stream_is_split(how, scatter):
    frames, payloads = sample_stream()
    stream = b"".join(frames)
    target = Target()
    got, idles = feed(FrameReceiver(target), stream, STEPS[how](random.Random(how)), scatter=scatter)

    assert [f.header for f in got] == [decode_header(f[:32]) for f in frames]
    assert [bytes(f.payload) for f in got] == [f[32:] for f in frames]
    assert got[0].json() == {"job": 1, "rank": 0, "lane": 2}
    assert got[2].header.kind is Kind.BYE and len(got[2].payload) == 0
    # Data payloads are the very views the target returned, and the bytes sit in the target array.
    data = [f for f in got if f.header.kind in DATA_KINDS]
    assert [f.header.chunk for f in data] == [0, 1, 2] and len(target.views) == 3
    for frame, view in zip(data, target.views):
        assert frame.payload is view
        chunk = frame.header.chunk
        assert target.region(chunk).tobytes() == payloads[chunk]
        target.region(chunk)[0] ^= 0xFF  # a change in the array shows through the payload: a view
        assert frame.payload[0] == target.region(chunk)[0]
    assert target.guards_intact()
    # Idle exactly at frame boundaries.
    boundaries = {sum(map(len, frames[:i + 1])) for i in range(len(frames))}
    for position, idle in idles:
        assert idle == (position in boundaries), position


def test_idle_and_zero_length_control_frame():
    receiver = FrameReceiver(Target())
    bye = pack_header(Kind.BYE, 1, 0, 0, 0, 0)
    assert receiver.idle
    receiver.buffer()[:10] = bye[:10]
    assert receiver.received(10) is None and not receiver.idle
    receiver.buffer()[:22] = bye[10:]
    frame = receiver.received(22)
    assert frame.header == Header(Kind.BYE, 1, 0, 0, 0, 0) and bytes(frame.payload) == b""
    assert receiver.idle and len(receiver.buffer()) == HEADER_BYTES
    push = data_frame(Kind.PUSH, 1, b"abcd")
    receiver.buffer()[:32] = push[:32]
    assert receiver.received(32) is None and not receiver.idle  # header read, payload pending
    assert len(receiver.buffer()) == 4
    receiver.buffer()[:4] = push[32:]
    assert bytes(receiver.received(4).payload) == b"abcd" and receiver.idle


def test_buffers_read_a_payload_and_the_next_header_in_one_call():
    receiver = FrameReceiver(Target())
    push = data_frame(Kind.PUSH, 1, b"abcd")
    bye = pack_header(Kind.BYE, 1, 0, 0, 0, 0)
    assert [len(b) for b in receiver.buffers()] == [HEADER_BYTES]  # no payload known yet
    receiver.buffers()[0][:] = push[:32]
    assert receiver.received(32) is None
    payload, head = receiver.buffers()
    assert len(payload) == 4 and len(head) == HEADER_BYTES
    payload[:] = push[32:]
    head[:10] = bye[:10]
    frame = receiver.received(14)  # the payload, and a part of the next header
    assert bytes(frame.payload) == b"abcd" and not receiver.idle
    assert receiver.received(0) is None
    assert [len(b) for b in receiver.buffers()] == [22]
    receiver.buffers()[0][:] = bye[10:]
    assert receiver.received(22).header.kind is Kind.BYE and receiver.idle
    # A whole empty frame behind a payload comes out of received(0), once the first is handled.
    receiver.buffers()[0][:] = push[:32]
    receiver.received(32)
    payload, head = receiver.buffers()
    payload[:] = push[32:]
    head[:] = bye
    assert receiver.received(36).header.kind is Kind.PUSH
    with pytest.raises(RuntimeError, match="received"):  # the BYE must be taken first
        receiver.buffers()
    assert receiver.received(0).header.kind is Kind.BYE and receiver.idle
    assert receiver.received(0) is None and len(receiver.buffer()) == HEADER_BYTES


def test_a_header_read_ahead_is_checked_only_after_the_frame_before_it_is_handled():
    """A REGISTER must be acted on before the INIT behind it is checked against the plan."""
    handled = []
    target = Target()

    def checking_target(header):
        assert handled and handled[-1].header.kind is Kind.REGISTER
        return target(header)

    frames, _ = sample_stream()
    stream = frames[4] + frames[3]  # REGISTER, then INIT of chunk 1
    got, _ = feed(FrameReceiver(checking_target), stream, lambda: 1 << 30, handled, scatter=True)
    assert [f.header.kind for f in got] == [Kind.REGISTER, Kind.INIT]


@pytest.mark.parametrize(
    "header, message",
    [
        (pack_header(Kind.PUSH, 1, 0, 3, 0, 8), "does not carry"),
        (pack_header(Kind.PUSH, 1, 0, 4, 0, 8), "plan has chunks"),
        (pack_header(Kind.RESULT, 1, 0, 0, 0, 63), "63 payload bytes"),
        (raw_header(magic=b"HTTP", length=64), "bad magic"),
        (raw_header(kind=Kind.REGISTER, length=MAX_CONTROL_BYTES + 1), "exceeds"),
    ],
)
def test_bad_header_raises_before_any_payload_byte(header, message):
    stream = header + bytes(range(1, 65)) * 2
    target = Target()
    before = target.array.copy()
    receiver, position = FrameReceiver(target), 0
    with pytest.raises(ProtocolError, match=message):
        while True:
            receiver.buffer()[:1] = stream[position:position + 1]
            position += 1
            receiver.received(1)
    assert position == HEADER_BYTES  # raised on the header's last byte
    assert np.array_equal(target.array, before) and target.views == []


@pytest.mark.parametrize(
    "header, message",
    [
        (pack_header(Kind.PUSH, 1, 0, 3, 0, 8), "does not carry"),
        (raw_header(magic=b"HTTP", length=64), "bad magic"),
    ],
)
def test_bad_header_read_ahead_raises_before_any_payload_byte(header, message):
    good = data_frame(Kind.PUSH, 0, bytes(64))
    stream = good + header + bytes(range(1, 65)) * 2
    target = Target()
    receiver = FrameReceiver(target)
    got = []
    with pytest.raises(ProtocolError, match=message):
        feed(receiver, stream, lambda: 1 << 30, got, scatter=True)
    assert len(got) == 1 and len(target.views) == 1  # the good frame, and no view for the bad one
    assert target.region(0).tobytes() == bytes(64) and target.guards_intact()
    assert all(target.region(c).tobytes() == bytes([GUARD]) * NBYTES[c] for c in (1, 2))


def mutate(rng, stream):
    stream = bytearray(stream)
    for _ in range(rng.randint(1, 6)):
        op, i = rng.randrange(3), rng.randrange(len(stream))
        if op == 0:
            stream[i] = rng.randrange(256)
        elif op == 1:
            stream[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del stream[i:i + rng.randint(1, 8)]
    return bytes(stream)


@pytest.mark.parametrize("scatter", [False, True], ids=["buffer", "buffers"])
@pytest.mark.parametrize("seed", range(300))
def test_garbage_and_mutated_frames_only_ever_raise_protocol_error(seed, scatter):
    rng = random.Random(seed)
    if seed % 3 == 0:
        stream = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
        if seed % 2:
            stream = b"PHUB\x01" + stream  # get past the magic and version checks
    else:
        frames, _ = sample_stream()
        stream = mutate(rng, b"".join(frames))
    target, got = Target(), []
    try:
        feed(FrameReceiver(target), stream, lambda: rng.randint(1, 50), got, scatter=scatter)
    except ProtocolError:
        pass
    for frame in got:
        try:  # decoding a control payload may fail, but only with ProtocolError
            assert frame.header.kind in DATA_KINDS or isinstance(frame.json(), dict)
        except ProtocolError:
            pass
    assert target.guards_intact()
