"""The links between rack servers of a two-phase reduction (see hierarchy.py), as one server
core sees them: core c of every rack talks to core c of the other racks; lower racks connect to
higher ones. Mixed into `phub.core.Core`."""
from __future__ import annotations

import socket
import time

from . import messages, wire
from .errors import ConfigError, ProtocolError
from .session import Job, Peer
from .transport import Link


class RackLinks:
    """Core methods for the rack-to-rack links (uses the Core's config, jobs and link helpers)."""

    def _on_rack_frame(self, job: Job, peer: Peer, frame: wire.Frame) -> None:
        header = frame.header
        if header.kind is wire.Kind.ERROR:  # whoever it claims to be from: the job is over
            return self._fail(job, f"rack {peer.rack} failed: {messages.error_message(frame.json())}")
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rack)
        if header.kind is wire.Kind.PARTIAL:
            self._act(job, job.state.on_partial(peer.rack, header))
        elif header.kind is wire.Kind.INIT:
            self._act(job, job.state.on_peer_init(header))
        elif header.kind is wire.Kind.PEER_READY:
            self._act(job, job.state.on_peer_ready(peer.rack, messages.peer_ready(frame.json())))
        elif header.kind is wire.Kind.SHARE and peer.rack == 0:  # rank 0's value, for this rack's workers
            self._share(job, *messages.share(frame.json()))
        elif header.kind is wire.Kind.BYE:
            job.racks_done.add(peer.rack)
        else:
            raise ProtocolError(f"a rack server may not send {header.kind.name} frames")

    def _connect_rack(self, job: Job, rack: int) -> Link:
        """Open this core's link to core `self.core` of rack `rack` (retrying while it starts up)."""
        host, port = self.config.peers[rack].rsplit(":", 1)
        address = (host, int(port) + self.core)  # every rack server uses the same port layout
        hello = {"job": job.spec.job_id, "token": job.spec.token, "peer_rack": self.config.rack, "core": self.core}
        deadline = time.monotonic() + self.config.timeout
        while True:
            try:
                sock = socket.create_connection(address, timeout=min(5.0, self.config.timeout))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ConfigError(f"cannot reach rack {rack}'s server at {address[0]}:{address[1]}: {exc}")
                time.sleep(0.1)  # it is still starting: retry until the deadline
        sock.sendall(wire.control_frame(wire.Kind.HELLO, job.spec.job_id, self.config.rack, hello))
        peer = Peer(-1)
        peer.job, peer.rack = job, rack
        return self._add_link(sock, peer)

    def _rack_hello(self, link: Link, peer: Peer, job: Job, hello: messages.Hello) -> None:
        rack = hello.peer_rack  # typed and within the racks by messages.hello
        if not self.config.peers or not 0 <= rack < self.config.rack:
            return self._refuse(link, f"unexpected rack server hello from rack {rack!r}")
        if hello.core != self.core or rack in job.peer_links:
            return self._refuse(link, f"rack {rack} connected core {hello.core!r} to core {self.core} twice "
                                      "or to the wrong core")
        if job.state is None:
            error = self._create_state(job, (0, 1))
            if error:
                return self._refuse(link, error)
        peer.job, peer.rack = job, rack
        self._admitted(link, peer)
        job.peer_links[rack] = link
        for parts in job.rack_backlog.pop(rack, ()):
            link.send(*parts)

    def _to_racks(self, job: Job, *parts) -> None:
        """Send to every other rack; a lower rack that has not connected yet gets it when it does
        (nothing it is sent can change before then: rounds need every rack's PEER_READY)."""
        for rack in range(self.config.racks):
            if rack == self.config.rack:
                continue
            if rack in job.peer_links:
                job.peer_links[rack].send(*parts)
            else:
                job.rack_backlog.setdefault(rack, []).append(parts)
