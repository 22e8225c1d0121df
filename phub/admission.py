"""Admission of connections that have not authenticated yet, as one server core sees them: what
a stranger may cost before its HELLO is accepted. Mixed into `phub.core.Core`.

- at most MAX_PENDING_PER_ADDRESS such connections per remote address (MAX_PENDING in all);
- control frames of at most `wire.HANDSHAKE_CONTROL_BYTES` until the HELLO is accepted;
- a deadline: a connection without an accepted HELLO after HANDSHAKE_SECONDS (or the server's
  timeout, if shorter) is dropped;
- refusals are logged once per cause and then counted (`session.RefusalLog`).
"""
from __future__ import annotations

import socket
import sys
import time

from . import wire
from .session import Peer
from .transport import Link

MAX_PENDING_PER_ADDRESS = 256  # connections of one address that have not authenticated (per core)
MAX_PENDING = 1024  # ... of all addresses together
HANDSHAKE_SECONDS = 10.0  # a connection that has not sent an accepted HELLO by then is dropped


def _log(message: str) -> None:
    print(f"phub server: {message}", file=sys.stderr, flush=True)


class Admission:
    """Core methods for connections before their HELLO (uses the Core's peers, pending, refusals)."""

    def _accept(self, listener: socket.socket, interface: int) -> None:
        try:
            sock, remote = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of file descriptors, say: refuse this one, keep serving
            return self.refusals.refused(f"cannot accept: {exc}")
        address = remote[0]
        if self.pending.get(address, 0) >= MAX_PENDING_PER_ADDRESS or sum(self.pending.values()) >= MAX_PENDING:
            self.refusals.refused(f"too many connections from {address} that have not authenticated "
                                  f"(at most {MAX_PENDING_PER_ADDRESS} per address, {MAX_PENDING} in all)")
            return sock.close()  # after the log line: whoever sees the close can find it
        peer = Peer(interface, address)
        link = self._add_link(sock, peer)
        link.receiver.max_control = wire.HANDSHAKE_CONTROL_BYTES  # no big allocation before a HELLO
        peer.pending = True
        self.pending[address] = self.pending.get(address, 0) + 1

    def _admitted(self, link: Link, peer: Peer) -> None:
        """The peer's HELLO was accepted: it may now send frames of every size."""
        link.receiver.max_control = wire.MAX_CONTROL_BYTES
        self._unpend(peer)

    def _unpend(self, peer: Peer) -> None:
        if peer.pending:
            peer.pending = False
            left = self.pending[peer.address] - 1
            if left:
                self.pending[peer.address] = left
            else:
                del self.pending[peer.address]

    def _sweep_pending(self) -> None:
        """Once a second: drop connections past the handshake deadline; log the refusal counts."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        if self.pending:
            deadline = min(HANDSHAKE_SECONDS, self.config.timeout)
            for link, peer in list(self.peers.items()):
                if peer.pending and now - peer.since > deadline:
                    self.refusals.refused(f"no HELLO accepted within {deadline:g} s")
                    self._drop(link)
        line = self.refusals.summary(now)
        if line:
            _log(f"core {self.core}: {line}")

