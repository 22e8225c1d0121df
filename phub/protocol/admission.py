"""Connections that have not authenticated yet, as one server core counts them: what a stranger
may cost before its HELLO is accepted (no I/O: the core's loop accepts and closes sockets).

- at most MAX_PENDING_PER_ADDRESS such connections per remote address (MAX_PENDING in all);
- control frames of at most `wire.HANDSHAKE_CONTROL_BYTES` until the HELLO is accepted (the
  protocol lowers the connection's limit, `Link.limit_control`);
- a deadline: a connection without an accepted HELLO after HANDSHAKE_SECONDS (or the server's
  timeout, if shorter) is dropped;
- refusals are logged once per cause and then counted (`jobs.RefusalLog`).
"""
from __future__ import annotations

from typing import Dict, Optional

from .jobs import Peer

MAX_PENDING_PER_ADDRESS = 256  # connections of one address that have not authenticated (per core)
MAX_PENDING = 1024  # ... of all addresses together
HANDSHAKE_SECONDS = 10.0  # a connection that has not sent an accepted HELLO by then is dropped


class Strangers:
    """The connections of one core that have not authenticated, counted per remote address."""

    def __init__(self) -> None:
        self.pending: Dict[str, int] = {}  # remote address -> its connections not yet authenticated

    def refusal(self, address: str) -> Optional[str]:
        """Why a new connection from `address` is turned away at once, or None."""
        if self.pending.get(address, 0) >= MAX_PENDING_PER_ADDRESS or sum(self.pending.values()) >= MAX_PENDING:
            return (f"too many connections from {address} that have not authenticated "
                    f"(at most {MAX_PENDING_PER_ADDRESS} per address, {MAX_PENDING} in all)")
        return None

    def arrived(self, peer: Peer) -> None:
        peer.pending = True
        self.pending[peer.address] = self.pending.get(peer.address, 0) + 1

    def left(self, peer: Peer) -> None:
        """The peer authenticated, or is gone."""
        if peer.pending:
            peer.pending = False
            left = self.pending[peer.address] - 1
            if left:
                self.pending[peer.address] = left
            else:
                del self.pending[peer.address]
