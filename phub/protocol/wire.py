"""Framing: the bytes on a connection, with no I/O in this module.

Every frame is a fixed 32-byte header followed by `length` payload bytes. Data frames (PUSH, INIT,
RESULT) carry exactly one chunk of float32 values; control frames carry a small JSON object.

Receiving is zero-copy: `FrameReceiver` tells the transport which buffers the next bytes must go
into, and for a data frame the payload buffer is a view of the chunk's final home (a per-worker
server slot, or the caller's output array). The transport only moves bytes:

    n = sock.recvmsg_into(receiver.buffers())[0]
    frame = receiver.received(n)      # a Frame once one is complete, else None
    while frame is not None:
        handle(frame)
        frame = receiver.received(0)  # a frame completed by bytes already received

While a payload is pending, `buffers()` also offers the receiver's own header buffer, so one call
reads the rest of the payload and the next frame's header: one system call per frame instead of
two. That header is checked only by the next `received` call, after the caller has handled the
frame before it (a REGISTER must be acted on before the INIT that follows it is checked). With
`buffer()` (one view, for `recv_into`) nothing is read ahead and `received(n)` completes at most
one frame.

A header that breaks the rules raises `ProtocolError` before a single payload byte is written.
"""
from __future__ import annotations

import enum
import functools
import json
import struct
from typing import Callable, List, NamedTuple, Optional, Sequence, Union

from ..errors import ProtocolError

MAGIC = b"PHUB"
VERSION = 1
SERVER_SENDER = 0xFFFFFFFF  # the `sender` field of frames a server sends
MAX_CONTROL_BYTES = 1 << 24  # a registration of ~100k arrays still fits
HANDSHAKE_CONTROL_BYTES = 1 << 16  # what a peer may send before its HELLO is accepted (a server sets it)

_HEADER = struct.Struct("<4sBBHIIIIII")
HEADER_BYTES = _HEADER.size  # 32
ITERATION_WORD = 5  # the iteration's place in a header, counted in 4-byte little-endian words


class Kind(enum.IntEnum):
    HELLO = 1  # client -> server, JSON: job, token, rank, lane (or -1: discovery only)
    WELCOME = 2  # server -> client, JSON: the server's cores, interfaces and endpoints
    REGISTER = 3  # client -> server, JSON: a batch of arrays (key, elements)
    INIT = 4  # rank 0 -> server, data: initial weights of one chunk
    READY = 5  # server -> client, JSON: a registered batch is initialized on this lane
    OPTIMIZER = 6  # rank 0 -> server, JSON: optimizer or aggregation mode for the job; on the verbs
    # transport the server echoes it (empty JSON) once applied: pushes there do not travel behind it
    PUSH = 7  # client -> server, data: one chunk of a gradient
    RESULT = 8  # server -> client, data: one chunk of new weights (or of the aggregate)
    BYE = 9  # client -> server: clean close
    ERROR = 10  # either way, JSON {"message": ...}: the sender gives up on the job
    PARTIAL = 11  # rack server -> the chunk's owner rack's server, data: a chunk aggregated over one
    # rack's workers
    PEER_READY = 12  # rack server -> rack server, JSON {"batch"}: this core registered a batch
    SHARE = 13  # JSON {"name", "value"}: rank 0's value for every worker of the job (a rendezvous
    # for what is not a tensor): rank 0 -> its server, server -> every worker (rank 0 too), and
    # rack 0's server -> the other racks' servers, on lane 0's core
    STATE_REQUEST = 14  # worker -> server, JSON {}: send this lane's optimizer state (checkpoints)
    STATE = 15  # data: one chunk's optimizer state (the momentum, zeros if none): server -> the
    # worker that asked; a server's first worker -> server, to resume from a checkpoint
    TOTAL = 16  # a chunk's owner rack's server -> the other racks' servers, data: the chunk summed
    # over every rack (phub.reduction.hierarchy)


DATA_KINDS = frozenset({Kind.INIT, Kind.PUSH, Kind.RESULT, Kind.PARTIAL, Kind.STATE, Kind.TOTAL})
_KIND_BY_VALUE = {int(k): k for k in Kind}


# Header and Frame are immutable named tuples rather than frozen dataclasses: one of each is built
# per received frame, and a tuple is built several times faster.
class Header(NamedTuple):
    kind: Kind
    job: int
    sender: int
    chunk: int
    iteration: int
    length: int
    flags: int = 0

    def pack(self) -> bytes:
        return pack_header(self.kind, self.job, self.sender, self.chunk, self.iteration, self.length, self.flags)


class Frame(NamedTuple):
    header: Header
    payload: Union[memoryview, bytearray]

    def json(self) -> dict:
        """The payload of a control frame, decoded; ProtocolError if it is not a JSON object."""
        return decode_json(self.header, self.payload)


# Build from one tuple of fields, without the argument handling of Header() and Frame().
_new_header = functools.partial(tuple.__new__, Header)
_new_frame = functools.partial(tuple.__new__, Frame)
_pack = _HEADER.pack
_unpack = _HEADER.unpack


def pack_header(kind, job, sender, chunk, iteration, length, flags=0) -> bytes:
    return _pack(MAGIC, VERSION, kind, flags, job, sender, chunk, iteration, length, 0)


def control_frame(kind: Kind, job: int, sender: int, obj: dict, chunk: int = 0) -> bytes:
    """A whole control frame (header + JSON payload) ready to send."""
    body = json.dumps(obj, separators=(",", ":")).encode()
    return pack_header(kind, job, sender, chunk, 0, len(body)) + body


def decode_header(raw: Union[bytes, bytearray, memoryview]) -> Header:
    """Parse and check the parts of a header that need no context (magic, version, kind, size)."""
    if len(raw) != HEADER_BYTES:
        raise ProtocolError(f"a header is {HEADER_BYTES} bytes, got {len(raw)}")
    magic, version, value, flags, job, sender, chunk, iteration, length, _ = _unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r}): not a phub peer")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version} is not supported (this side speaks {VERSION})")
    kind = _KIND_BY_VALUE.get(value)
    if kind is None:
        raise ProtocolError(f"unknown frame kind {value}")
    if length > MAX_CONTROL_BYTES and kind not in DATA_KINDS:
        raise ProtocolError(f"{kind.name} frame of {length} bytes exceeds the {MAX_CONTROL_BYTES}-byte limit")
    return _new_header((kind, job, sender, chunk, iteration, length, flags))


def decode_json(header: Header, payload) -> dict:
    try:
        obj = json.loads(bytes(payload))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # Recursion: deeply nested JSON
        raise ProtocolError(f"{header.kind.name} frame carries invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{header.kind.name} frame must carry a JSON object, got {type(obj).__name__}")
    return obj


def check_sender(header: Header, *, job: int, sender: int, num_workers: Optional[int] = None) -> None:
    """Reject a frame from the wrong job or the wrong rank (a connection speaks for one of each)."""
    if header.job != job:
        raise ProtocolError(f"{header.kind.name} frame for job {header.job} on a connection of job {job}")
    if num_workers is not None and header.sender != SERVER_SENDER and header.sender >= num_workers:
        raise ProtocolError(
            f"{header.kind.name} frame from rank {header.sender}, outside the job's {num_workers} workers"
        )
    if header.sender != sender:
        raise ProtocolError(f"{header.kind.name} frame claims sender {header.sender} on the connection of {sender}")


def check_chunk(header: Header, chunk_nbytes: Sequence[int], allowed: Callable[[int], bool]) -> None:
    """Reject a data frame whose chunk id is out of range, not carried here, or of the wrong length."""
    if not 0 <= header.chunk < len(chunk_nbytes):
        raise ProtocolError(
            f"{header.kind.name} frame for chunk {header.chunk}, but the plan has chunks 0..{len(chunk_nbytes) - 1}"
        )
    if not allowed(header.chunk):
        raise ProtocolError(f"{header.kind.name} frame for chunk {header.chunk}, which this connection does not carry")
    expected = chunk_nbytes[header.chunk]
    if header.length != expected:
        raise ProtocolError(
            f"{header.kind.name} frame for chunk {header.chunk} has {header.length} payload bytes, the plan says {expected}"
        )


# Where a data frame's payload goes: given its (already decoded) header, return a writable byte view
# of exactly `header.length` bytes, or raise ProtocolError. Control frames are buffered internally.
PayloadTarget = Callable[[Header], memoryview]


class FrameReceiver:
    """Incremental frame parser for one connection (sans-IO, zero-copy for data payloads).

    State: `_view` is the buffer being filled (the header buffer, or the payload of the frame whose
    header is `_header`) and `_filled` how many of its bytes are in. Bytes received past the end of
    a payload are the next header's first ones: they count as that header's `_filled`.
    """

    __slots__ = ("_target", "_head", "_header", "_payload", "_view", "_filled", "max_control")

    def __init__(self, payload_target: PayloadTarget, max_control: int = MAX_CONTROL_BYTES):
        self._target = payload_target
        self.max_control = max_control  # the largest control payload accepted (lowered before a handshake)
        self._head = memoryview(bytearray(HEADER_BYTES))
        self._header: Optional[Header] = None
        self._payload = None
        self._view = self._head
        self._filled = 0

    def buffer(self) -> memoryview:
        """The writable view the next received bytes must be written into (never empty)."""
        if self._filled == len(self._view):  # a header is in but unchecked: received(0) first
            raise RuntimeError("call received(0) until it returns None before receiving more")
        return self._view[self._filled:]

    def buffers(self) -> List[memoryview]:
        """Writable views the next received bytes go into, in order (for `recvmsg_into`): the rest
        of the current header or payload, and after a payload the header buffer for the next frame."""
        if self._header is not None:
            return [self._view[self._filled:], self._head]
        return [self.buffer()]

    @property
    def idle(self) -> bool:
        """True between frames (a connection closing now loses nothing half-received)."""
        return self._header is None and self._filled == 0

    def received(self, n: int) -> Optional[Frame]:
        """Account for `n` bytes written into `buffer()` or `buffers()`; return the frame they
        complete, if any. After a frame, call `received(0)` (again, until None) before receiving
        more: it checks a header that arrived with the frame and returns its frame if it is empty."""
        filled = self._filled + n
        size = len(self._view)
        if filled < size:
            self._filled = filled
            return None
        if self._header is not None:  # a payload is complete; what follows went to the header buffer
            frame = _new_frame((self._header, self._payload))
            self._header = self._payload = None
            self._view = self._head
            self._filled = filled - size
            return frame
        self._filled = filled
        header = decode_header(self._head)
        length = header.length
        if header.kind in DATA_KINDS:
            view = self._target(header)
            if len(view) != length:  # a bug in the target, not in the peer
                raise AssertionError(f"payload target gave {len(view)} bytes for {length}")
            payload = view
        else:
            if length > self.max_control:
                raise ProtocolError(f"{header.kind.name} frame of {length} bytes exceeds the {self.max_control}-byte "
                                    "limit of this connection (before a HELLO is accepted, or in all)")
            payload = bytearray(length)
            view = memoryview(payload)
        if length:
            self._header, self._payload, self._view, self._filled = header, payload, view, 0
            return None
        self._filled = 0
        return _new_frame((header, payload))
