"""Test doubles that ship with phub: drive its protocol state machines without sockets or time.

    conn = MemoryConnection()
    protocol.connection_made(conn, interface=0, address="198.18.0.2")
    protocol.frame_received(conn, frame_of(wire.control_frame(wire.Kind.HELLO, ...)))
    [welcome] = conn.take()                   # what the protocol sent, as decoded frames

`MemoryConnection` stands where a `links.Link` stands (send, finish, close, limit_control,
limit_queue) and keeps what was sent; `FakeClock` is a clock the test moves by hand; `feed`
receives bytes as a link does (payloads where the protocol says, frames handed over one by one);
`frame_of` turns the bytes of one whole frame into the `wire.Frame` a receiving link would hand
over.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from . import wire

__all__ = ["MemoryConnection", "FakeClock", "feed", "frame_of", "frames_of"]


def feed(data: bytes, payload_target: wire.PayloadTarget, on_frame: Callable[[wire.Frame], None]) -> None:
    """Receive `data` as a link would: each data payload written where `payload_target` says,
    each whole frame handed to `on_frame` before the next header is looked at. ProtocolError for
    bytes that break the rules; ValueError if `data` ends inside a frame."""
    receiver = wire.FrameReceiver(payload_target)
    view, at = memoryview(bytes(data)), 0
    while at < len(view):
        buffer = receiver.buffer()
        n = min(len(buffer), len(view) - at)
        buffer[:n] = view[at:at + n]
        at += n
        frame = receiver.received(n)
        while frame is not None:
            on_frame(frame)
            frame = receiver.received(0)
    if not receiver.idle:
        raise ValueError(f"{len(data)} bytes end inside a frame")


def frames_of(data: bytes) -> List[wire.Frame]:
    """Every whole frame in `data`, decoded; data payloads are copied into fresh buffers."""
    frames: List[wire.Frame] = []
    feed(data, lambda header: memoryview(bytearray(header.length)), frames.append)
    return frames


def frame_of(data: bytes) -> wire.Frame:
    """The one frame `data` holds."""
    [frame] = frames_of(data)
    return frame


class MemoryConnection:
    """A connection that keeps what is sent on it (`sent`: the parts, copied when sent)."""

    def __init__(self, name: str = ""):
        self.name = name
        self.sent: List[bytes] = []
        self.closed = False
        self.finished_with: Optional[bytes] = None  # the last frame `finish` sent, if any
        self.discarded = False  # `finish` dropped what was queued
        self.max_control = wire.MAX_CONTROL_BYTES
        self.max_queued: Optional[int] = None  # what `limit_queue` set (nothing waits here: it is kept, not used)

    def __repr__(self) -> str:
        return f"MemoryConnection({self.name!r})"

    def send(self, *parts) -> None:
        if not self.closed:
            self.sent.append(b"".join(bytes(part) for part in parts))

    def finish(self, last: Optional[bytes] = None, discard_queued: bool = False) -> None:
        if last is not None and not self.closed:
            self.discarded = discard_queued
            self.finished_with = bytes(last)
            self.sent.append(bytes(last))
        self.closed = True

    def close(self) -> None:
        self.closed = True

    def limit_control(self, nbytes: int) -> None:
        self.max_control = nbytes

    def limit_queue(self, nbytes: Optional[int]) -> None:
        self.max_queued = nbytes

    def take(self) -> List[wire.Frame]:
        """The frames sent since the last `take`, decoded."""
        data, self.sent = b"".join(self.sent), []
        return frames_of(data)


class FakeClock:
    """A monotonic clock that moves only when told: `clock()` reads it, `clock.advance(s)`."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
