"""Moving frames over non-blocking TCP sockets: the only place that touches a socket's bytes.

`Link` pairs a socket with a `wire.FrameReceiver` (bytes in) and an output queue (bytes out).
Both the server cores and the worker's I/O thread drive many links from one selector loop.
"""
from __future__ import annotations

import collections
import selectors
import socket
from typing import Callable, List, Optional

from . import wire

_MAX_PARTS = 64  # sendmsg takes a bounded iovec


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)


class LinkClosed(Exception):
    """The peer closed the connection (or it broke); `midframe` tells whether a frame was cut."""

    def __init__(self, reason: str, midframe: bool):
        super().__init__(reason)
        self.midframe = midframe


class Link:
    """One connection. `on_frame(link, frame)` is called for each complete frame received."""

    def __init__(self, sock: socket.socket, selector: selectors.BaseSelector,
                 payload_target: wire.PayloadTarget, on_frame: Callable[["Link", wire.Frame], None]):
        self.sock = sock
        self.selector = selector
        self.receiver = wire.FrameReceiver(payload_target)
        self.on_frame = on_frame
        self.outq: "collections.deque[memoryview]" = collections.deque()
        self._writing = False
        self.closed = False
        tune(sock)
        selector.register(sock, selectors.EVENT_READ, self)

    def on_readable(self) -> None:
        """Receive everything the socket has; raises LinkClosed on EOF or error, ProtocolError on bad input."""
        receiver = self.receiver
        recv_into = self.sock.recv_into
        while not self.closed:
            try:
                n = recv_into(receiver.buffer())
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise LinkClosed(f"connection error: {exc}", not receiver.idle) from None
            if n == 0:
                raise LinkClosed("connection closed by peer", not receiver.idle)
            frame = receiver.received(n)
            if frame is not None:
                self.on_frame(self, frame)

    def send(self, *parts) -> None:
        """Queue `parts` (bytes or byte memoryviews) for sending; sends at once what the socket
        takes without blocking. The parts must stay unchanged until sent (see aggregation.py).
        Never raises: a failed send shows up as LinkClosed when the link is next read."""
        if self.closed:
            return
        if self.outq:
            self.outq.extend(memoryview(p) for p in parts)
            return
        try:
            sent = self.sock.sendmsg(parts)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            # Not raised here: the caller may be serving another link. The broken socket turns
            # readable, and reading it reports the loss, attributed to this link.
            return
        for part in parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            self.outq.append(memoryview(part)[sent:])
            sent = 0
        if self.outq:
            self._want_write(True)

    def on_writable(self) -> None:
        outq = self.outq
        while outq:
            parts: List[memoryview] = [outq[i] for i in range(min(len(outq), _MAX_PARTS))]
            try:
                sent = self.sock.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise LinkClosed(f"send failed: {exc}", True) from None
            while sent:
                head = outq[0]
                if sent >= len(head):
                    sent -= len(head)
                    outq.popleft()
                else:
                    outq[0] = head[sent:]
                    sent = 0
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

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.selector.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()


def connect(address, timeout: float) -> socket.socket:
    """A blocking TCP connect with a deadline; OSError names the address on failure."""
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise OSError(f"cannot connect to phub server at {address[0]}:{address[1]}: {exc}") from None
    return sock


def parse_address(text: str, default_port: Optional[int] = None):
    host, sep, port = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"address {text!r} must be HOST:PORT")
        return text, default_port
    return host.strip("[]"), int(port)
