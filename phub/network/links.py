"""Moving frames over non-blocking TCP sockets: the only place that touches a socket's bytes.

`Link` pairs a socket with a `wire.FrameReceiver` (bytes in) and an output queue (bytes out).
Both the server cores and the worker's I/O thread drive many links from one selector loop.

System calls are the cost that matters here (a 32 KB chunk is one frame), so a link reads each
payload together with the next frame's header (`recvmsg_into`, one call per frame) and sends in
batches: parts queued while the loop handles one round of events go out together at the end of
that round (`flush_links`), or as soon as `_MAX_PARTS` are queued, gathered into few `sendmsg`
calls by `send_queued` (C, phub/_fastpath_send.h; `send_queued_python` when it is not built).
Two subclasses hand the data frames to the C loops of phub/_fastpath.c: a `StagedLink` reads
many frames per system call into a staging buffer, and a `DirectLink` lets a C reader read each
frame straight into its place (a worker's large results). The three differ only in `_read`.
"""
from __future__ import annotations

import collections
import itertools
import mmap
import os
import selectors
import socket
import time
from typing import Callable, List, Optional, Tuple

from ..protocol import wire
from ..errors import ConfigError, JobFailed, PHubTimeout, ProtocolError

_MAX_PARTS = 64  # queued parts that are sent at once; also the Python sender's parts per sendmsg
_DRAINED = object()  # what Link._read returns when the socket has nothing more for now


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)


class LinkClosed(Exception):
    """The peer closed the connection (or it broke); `midframe` tells whether a frame was cut."""

    def __init__(self, reason: str, midframe: bool):
        super().__init__(reason)
        self.midframe = midframe


class Link:
    """One connection. `on_frame(link, frame)` is called for each complete frame received.

    `outbox`: the owner's list of links with queued output, which it passes to `flush_links` at
    the end of each loop iteration; without one, `send` sends at once.

    What waits to be sent while the peer does not read may be bounded (`limit_queue`): a peer
    that lets more pile up is dropped, its queue freed, and the next `on_readable` raises
    LinkClosed saying so (the socket is shut for reading, so the owner's selector calls it).
    """

    def __init__(self, sock: socket.socket, selector: selectors.BaseSelector,
                 payload_target: wire.PayloadTarget, on_frame: Callable[["Link", wire.Frame], None],
                 outbox: Optional[List["Link"]] = None):
        self.sock = sock
        self.selector = selector
        self.receiver = wire.FrameReceiver(payload_target)
        self.on_frame = on_frame
        self.outq: "collections.deque" = collections.deque()  # bytes or byte memoryviews
        self._outbox = outbox
        self._writing = False  # the selector watches for EVENT_WRITE: outq waits for room
        self.max_queued: Optional[int] = None  # bytes outq may hold while waiting for room (None: no bound)
        self._queued = 0  # while _writing: outq's bytes or more (recounted when it passes max_queued)
        self.overflow: Optional[str] = None  # why the link was dropped for not reading (see limit_queue)
        self.closed = False
        tune(sock)
        selector.register(sock, selectors.EVENT_READ, self)

    def on_readable(self) -> None:
        """Receive everything the socket has; raises LinkClosed on EOF or error, ProtocolError on bad input."""
        if self.closed:  # dropped while handling another link's event of the same round
            return
        try:
            self._receive()
        except LinkClosed:
            if self.overflow is None:
                raise
        if self.overflow is not None:  # the cause, not the shut socket's end of stream
            raise LinkClosed(self.overflow, True)

    def _receive(self) -> None:
        receiver, on_frame = self.receiver, self.on_frame
        frame = receiver.received(0)  # what a pass cut short by an exception left (normally nothing)
        while True:
            while frame is not None:
                on_frame(self, frame)
                if self.closed or self.overflow is not None:  # the handler dropped this link, or overfilled it
                    return
                frame = receiver.received(0)
            frame = self._read()
            if frame is _DRAINED:
                return

    def _read(self):
        """One read: the frame it completed, None (none yet, read on) or _DRAINED (the socket has
        nothing more now, or the link was dropped). Raises LinkClosed as `on_readable` does."""
        receiver = self.receiver
        try:
            n = self.sock.recvmsg_into(receiver.buffers())[0]
        except (BlockingIOError, InterruptedError):
            return _DRAINED
        except OSError as exc:
            raise LinkClosed(f"connection error: {exc}", not receiver.idle) from None
        if n == 0:
            raise LinkClosed("connection closed by peer", not receiver.idle)
        return receiver.received(n)

    def send(self, *parts) -> None:
        """Queue `parts` (bytes or byte memoryviews) for sending. The parts must stay unchanged
        until sent (see reduction/aggregation.py). Never raises: a failed send shows up as LinkClosed when
        the link is next read."""
        if self.closed:
            return
        outq = self.outq
        if self._writing:  # the peer is behind: what piles up is counted (see limit_queue)
            if self.overflow is None:
                outq.extend(parts)
                self._queued += sum(map(len, parts))
                if self.max_queued is not None and self._queued > self.max_queued:
                    self._check_queue()
            return
        if not outq:
            if self._outbox is None:
                outq.extend(parts)
                return self.flush()
            self._outbox.append(self)
        outq.extend(parts)
        if len(outq) >= _MAX_PARTS:
            self.flush()

    def limit_queue(self, nbytes: Optional[int]) -> None:
        """Drop the link when more than `nbytes` wait to be sent (None: no bound). Counted while
        the socket is full, so a peer that reads costs nothing here."""
        self.max_queued = nbytes
        if self._writing and nbytes is not None:
            self._check_queue()

    def _check_queue(self) -> None:
        """Recount what waits (the running count only grows); past the bound, drop what waits
        and shut the socket for reading: the owner's next read of it reports `overflow`."""
        self._queued = sum(map(len, self.outq))
        if self._queued <= self.max_queued:
            return
        self.overflow = (f"stopped reading what it is sent: more than {self.max_queued} bytes waited for it "
                         "(a peer must read its results as they come)")
        self.outq.clear()
        self._queued = 0
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:  # already broken: that is reported on the next read as well
            pass

    def flush(self) -> None:
        """Send what is queued, as far as the socket takes it without blocking; the rest waits
        for EVENT_WRITE. Never raises (see `send`)."""
        if self._writing or self.closed:
            return
        try:
            if send_queued(self.sock.fileno(), self.outq):
                return
        except OSError:
            # Not raised here: the caller may be serving another link. The broken socket turns
            # readable, and reading it reports the loss, attributed to this link.
            self.outq.clear()
            return
        self._want_write(True)

    def on_writable(self) -> None:
        if self.overflow is not None:
            raise LinkClosed(self.overflow, True)
        try:
            drained = send_queued(self.sock.fileno(), self.outq)
        except OSError as exc:
            raise LinkClosed(f"send failed: {exc}", True) from None
        if drained:
            self._want_write(False)

    def service(self, mask: int) -> None:
        """Handle one selector event for this link."""
        if mask & selectors.EVENT_WRITE:
            self.on_writable()
        if mask & selectors.EVENT_READ:
            self.on_readable()

    def _want_write(self, on: bool) -> None:
        if on != self._writing and not self.closed:
            self._writing = on
            self._queued = sum(map(len, self.outq)) if on else 0
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
            self.selector.modify(self.sock, events, self)

    def flush_blocking(self, timeout: float) -> None:
        """Best effort: push out what is queued within `timeout` seconds (used before closing)."""
        if self.closed or not self.outq:
            return
        try:
            self.sock.settimeout(timeout)
            for part in list(self.outq):
                self.sock.sendall(part)
            self.outq.clear()
        except OSError:
            pass

    def limit_control(self, nbytes: int) -> None:
        """Refuse control frames larger than `nbytes` from now on (a peer not yet authenticated)."""
        self.receiver.max_control = nbytes

    def finish(self, last: Optional[bytes] = None, discard_queued: bool = False) -> None:
        """Close, after sending `last` (behind what is queued, or instead of it with
        `discard_queued`: a result cut mid-way is worthless, an ERROR must get through); waits
        at most a second for it to leave."""
        if last is not None and not self.closed:
            if discard_queued:
                self.outq.clear()
            self.send(last)
            self.flush_blocking(1.0)
        self.close()

    def close(self) -> None:
        """Close the socket and free what was queued for it (a closed link sends nothing)."""
        if self.closed:
            return
        self.closed = True
        self.outq.clear()
        try:
            self.selector.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()


# How a staged link hands the bytes it read to a C loop (phub/_fastpath.c): (link, staging, start,
# end) -> (offset of the first byte not consumed, whether a frame for the Python path starts there).
FastFrames = Callable[["Link", memoryview, int, int], Tuple[int, bool]]
STAGING_BYTES = 1024 * 1024  # a staged link's read size, unless chunks are larger (measured: docs/data-path-log.md)


def staging_capacity(chunk_bytes: int) -> int:
    """A staged link's buffer: room for two of the largest data frames, so one cut in half fits."""
    return max(STAGING_BYTES, 2 * (chunk_bytes + wire.HEADER_BYTES))


class StagedLink(Link):
    """A connection read in large reads into a staging buffer (`capacity` bytes, see
    `staging_capacity`).

    `fast_frames` (a C loop of phub/_fastpath.c: a server core's pushes, a worker's results) takes
    the data frames it finds there, many frames per system call; every other frame is fed from the
    staging buffer to the link's FrameReceiver, so it is checked and handled exactly as on a plain
    `Link`. A frame larger than what is staged (a big REGISTER) is read straight into the
    receiver's buffer.
    """

    def __init__(self, sock, selector, payload_target, on_frame, outbox, fast_frames: FastFrames, capacity: int):
        super().__init__(sock, selector, payload_target, on_frame, outbox)
        self._fast_frames = fast_frames
        # Anonymous memory: its pages are taken only as reads fill them, so a connection that
        # sends only control frames (a stranger, say) costs a page, not `capacity` bytes.
        self._staging = memoryview(mmap.mmap(-1, capacity))
        self._start = self._end = 0  # staging[start:end] holds bytes read but not yet consumed

    def close(self) -> None:
        super().close()
        self._staging = memoryview(b"")  # its pages go back now, even while the link object is kept
        self._start = self._end = 0

    def _read(self):
        receiver, staging = self.receiver, self._staging
        if self._start < self._end:
            at_frame = not receiver.idle
            if not at_frame:
                self._start, at_frame = self._fast_frames(self, staging, self._start, self._end)
                if self.closed:
                    return _DRAINED
            if at_frame:  # feed the Python path: a copy, for the frames the C loop does not take
                buffer = receiver.buffer()
                n = min(len(buffer), self._end - self._start)
                buffer[:n] = staging[self._start:self._start + n]
                self._start += n
                return receiver.received(n)
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(staging):  # an incomplete frame at the end: move it to the front
            rest = self._end - self._start
            staging[:rest] = staging[self._start:self._end]
            self._start, self._end = 0, rest
        direct = not receiver.idle and self._start == self._end
        try:
            n = self.sock.recv_into(receiver.buffer() if direct else staging[self._end:])
        except (BlockingIOError, InterruptedError):
            return _DRAINED
        except OSError as exc:
            raise LinkClosed(f"connection error: {exc}", not receiver.idle or self._start < self._end) from None
        if n == 0:
            raise LinkClosed("connection closed by peer", not receiver.idle or self._start < self._end)
        if direct:
            return receiver.received(n)
        self._end += n
        return None


# How a direct link's C reader (phub/_fastpath_direct.h: a worker's results) reads: (link, fd,
# cursor) -> one of these codes.
READ_WOULD_BLOCK, READ_FOREIGN, READ_CLOSED, READ_STALE = range(4)
DirectFrames = Callable[["Link", int, bytearray], int]
# The cursor's layout (read_cursor in phub/_fastpath_direct.h): header and payload bytes read so
# far (u32 each), then the current frame's header, then room for the next one.
_CURSOR_PROGRESS, _CURSOR_HEADER = slice(0, 8), slice(8, 8 + wire.HEADER_BYTES)
try:
    from .._fastpath import CURSOR_BYTES  # a reader's position in a link (see DirectLink)
except ImportError:  # not built: no C readers, no direct links
    CURSOR_BYTES = 0
# The smallest chunk a worker's direct link pays off for: below it, the system call per frame
# costs more than the staged link's copy (measured: docs/data-path-log.md).
DIRECT_MIN_BYTES = 16 * 1024


class DirectLink(Link):
    """A connection whose data frames a C reader (`read_frames`: a worker's results) reads
    itself, each payload straight into its place (the caller's array) together with the next
    frame's header: one system call per frame, no copy in user space. Every frame the reader does
    not take is read and handled here exactly as on a plain `Link`, from its header on (which
    the reader leaves in the cursor)."""

    def __init__(self, sock, selector, payload_target, on_frame, outbox, read_frames: DirectFrames):
        super().__init__(sock, selector, payload_target, on_frame, outbox)
        self._read_frames = read_frames
        self._cursor = bytearray(CURSOR_BYTES)

    def _midframe(self) -> bool:
        return not self.receiver.idle or any(self._cursor[_CURSOR_PROGRESS])

    def _read(self):
        receiver, cursor = self.receiver, self._cursor
        try:
            if not receiver.idle:  # a frame the reader handed over: read its rest, and no further
                n = self.sock.recv_into(receiver.buffer())
                if n == 0:
                    raise LinkClosed("connection closed by peer", True)
                return receiver.received(n)
            status = self._read_frames(self, self.sock.fileno(), cursor)
        except (BlockingIOError, InterruptedError):
            return _DRAINED
        except OSError as exc:
            raise LinkClosed(f"connection error: {exc}", self._midframe()) from None
        if self.closed or status == READ_WOULD_BLOCK:
            return _DRAINED
        if status == READ_CLOSED:
            raise LinkClosed("connection closed by peer", self._midframe())
        header = cursor[_CURSOR_HEADER]
        if status == READ_STALE:
            stale = wire.decode_header(header)
            raise ProtocolError(f"{stale.kind.name} frame for chunk {stale.chunk} stopped being expected while it "
                                "was read")
        receiver.buffer()[:wire.HEADER_BYTES] = header  # READ_FOREIGN: the frame is Python's
        return receiver.received(wire.HEADER_BYTES)


def send_queued_python(fd: int, outq: "collections.deque") -> bool:
    """`_fastpath.send_queued` in Python (the reference, and the path when it is not built): send
    the parts queued in `outq` on the non-blocking socket `fd` as far as it takes them, `_MAX_PARTS`
    per sendmsg; sent parts leave the queue, a part sent in part leaves its tail. True when the
    queue is empty, False when the socket is full; OSError for any other failure."""
    while outq:
        batch = outq if len(outq) <= _MAX_PARTS else list(itertools.islice(outq, _MAX_PARTS))
        try:
            sent = os.writev(fd, batch)
        except (BlockingIOError, InterruptedError):
            return False
        whole = sum(map(len, batch))
        _consume(outq, sent, batch, whole)
        if sent < whole:
            return False
    return True


def _consume(outq: "collections.deque", sent: int, batch, whole: int) -> None:
    """Drop the `sent` bytes at the front of `outq`, whose first parts `batch` (`whole` bytes) went
    to sendmsg (a part sent in part leaves its tail)."""
    if sent == whole:  # the common case, without a check per part
        if batch is outq:
            outq.clear()
        else:
            popleft = outq.popleft
            for _ in range(len(batch)):
                popleft()
        return
    while outq:
        head = outq[0]
        size = len(head)
        if sent < size:
            if sent:
                outq[0] = memoryview(head)[sent:]
            return
        sent -= size
        outq.popleft()


try:
    from .._fastpath import send_queued
except ImportError:  # not built
    send_queued = send_queued_python


def flush_links(outbox: List[Link]) -> None:
    """Send what the links in `outbox` queued during this loop iteration (see `Link`)."""
    for link in outbox:
        link.flush()
    outbox.clear()


CONNECT_RETRY_MAX = 1.0  # seconds between two tries at most, while the server is not listening yet


def connect(address, timeout: float) -> socket.socket:
    """A TCP connection to a phub server; blocks until it is made, at most `timeout` seconds.

    A refused connection is tried again (after 50 ms, doubling up to 1 s) until `timeout` has
    passed: a worker may start before its server listens (`srun` starts every task at once).
    OSError names the address and, when the server never came up, the timeout."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        left = deadline - time.monotonic()
        try:
            return socket.create_connection(address, timeout=max(left, 0.001))
        except ConnectionRefusedError:
            if left <= pause:
                raise OSError(f"no phub server listens at {address[0]}:{address[1]}: connections were refused "
                              f"for {timeout:g} s (the worker's connect timeout, PHUB_TIMEOUT); is the server "
                              "started, and is that its address?") from None
        except OSError as exc:
            raise OSError(f"cannot connect to phub server at {address[0]}:{address[1]}: {exc}") from None
        time.sleep(pause)  # not a synchronization: the server is not up yet, ask again
        pause = min(pause * 2, CONNECT_RETRY_MAX)


def parse_addresses(text: str) -> List[Tuple[str, int]]:
    """`HOST:PORT[,HOST:PORT...]` as (host, port) pairs; ConfigError says what is wrong."""
    if not isinstance(text, str) or not text.strip(" ,"):
        raise ConfigError("no server address given")
    pairs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) < 65536:
            raise ConfigError(f"server address {part!r} must be HOST:PORT with a port in 1..65535")
        pairs.append((host.strip("[]"), int(port)))
    return pairs


def _reject_data(header: wire.Header) -> memoryview:
    raise ProtocolError(f"expected a control frame during the handshake, got {header.kind.name}")


def recv_control(sock: socket.socket, timeout: float, peer: str = "the peer") -> wire.Frame:
    """Block until one whole control frame arrives on `sock` (a handshake, before any loop runs).

    Raises PHubTimeout after `timeout` seconds, ProtocolError for a bad frame or a data frame,
    JobFailed if `peer` closes the connection first (a peer that is gone, as on a running link).
    """
    receiver = wire.FrameReceiver(_reject_data)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise socket.timeout
            sock.settimeout(left)
            n = sock.recv_into(receiver.buffer())
        except socket.timeout:
            raise PHubTimeout(f"no answer from {peer} within {timeout:g} s") from None
        if n == 0:
            raise JobFailed(f"{peer} closed the connection during the handshake")
        frame = receiver.received(n)
        if frame is not None:
            return frame
