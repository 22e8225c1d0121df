"""One server core's I/O loop: sockets in, bytes out; every decision is the protocol's.

Each core runs in its own process (see processes.py). It accepts connections on every interface,
wraps each in a `links.Link` (a `StagedLink` when the C push loop can take its pushes) and
hands the protocol (`protocol.core.CoreProtocol`) what happens on it: a connection, a frame,
a loss, a bad frame. The protocol answers by sending on the links; this loop flushes them once
per round of events, polls the RDMA data paths and lets the protocol check its clocks.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time
from typing import List

from ..config import Endpoint, ServerConfig
from ..errors import ConfigError, JobFailed, ProtocolError
from ..reduction.kernels import for_owned_buffers, get_backend
from ..protocol.core import CoreProtocol
from ..network.links import Link, LinkClosed, StagedLink, flush_links, staging_capacity


def _log(message: str) -> None:
    print(f"phub server: {message}", file=sys.stderr, flush=True)


class Core:
    """The event loop of one server core (runs in its own process)."""

    def __init__(self, config: ServerConfig, core: int, listeners: List[socket.socket],
                 endpoints: List[List[Endpoint]]):
        self.config = config
        self.selector = selectors.DefaultSelector()
        for interface, listener in enumerate(listeners):
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, interface)
        self.outbox: List[Link] = []  # links with output queued in this loop iteration
        kernels = for_owned_buffers(get_backend("auto"))  # every buffer a core updates is its own
        self.protocol = CoreProtocol(config, core, endpoints, kernels, open_connection=self._connect, log=_log)

    def run(self) -> int:
        """Serve until every job has ended (with `once`) or forever; return the exit status."""
        protocol = self.protocol
        while not protocol.finished:
            for key, mask in self.selector.select(timeout=protocol.nap):
                if isinstance(key.data, int):
                    self._accept(key.fileobj, key.data)
                    continue
                link: Link = key.data
                try:
                    link.service(mask)
                except LinkClosed as exc:
                    protocol.connection_lost(link, str(exc), exc.midframe)
                except ProtocolError as exc:
                    protocol.bad_frame(link, str(exc))
                except JobFailed as exc:  # the RDMA work this frame asked for could not be done
                    protocol.data_path_failed(link, exc)
                except Exception as exc:  # a bug a peer's bytes reached: it may end that job, never the core
                    protocol.bad_frame(link, f"the server could not handle it ({type(exc).__name__}: {exc})"[:400])
            protocol.poll_data_paths()
            flush_links(self.outbox)
            protocol.tick()
        for link in protocol.rack_connections():  # the other racks may still be reading our last partials
            link.flush_blocking(self.config.timeout)
        return protocol.exit_status

    def _accept(self, listener: socket.socket, interface: int) -> None:
        try:
            sock, remote = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of file descriptors, say: refuse this one, keep serving
            return self.protocol.refusals.refused(f"cannot accept: {exc}")
        if self.protocol.refusal(remote[0]):
            return sock.close()  # after the protocol logged why: whoever sees the close can find it
        self.protocol.connection_made(self._link(sock), interface, remote[0])

    def _link(self, sock: socket.socket) -> Link:
        protocol = self.protocol
        target = lambda header: protocol.payload_target(link, header)  # noqa: E731
        if protocol.fast_pushes_on:
            link = StagedLink(sock, self.selector, target, protocol.frame_received, self.outbox,
                              protocol.fast_pushes, staging_capacity(self.config.chunk_bytes))
        else:
            link = Link(sock, self.selector, target, protocol.frame_received, self.outbox)
        return link

    def _connect(self, address, source: str) -> Link:
        """A link from this server's address `source` (an ephemeral port) to another rack's server
        at `address`, retrying while it starts up (at most the server's timeout, then ConfigError
        saying why)."""
        deadline = time.monotonic() + self.config.timeout
        while True:
            try:
                return self._link(socket.create_connection(address, timeout=min(5.0, self.config.timeout),
                                                           source_address=(source, 0)))
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ConfigError(str(exc)) from None
                time.sleep(0.1)  # it is still starting: retry until the deadline
