"""The PHub server: one process per core, each serving its lanes on every interface.

`Server.start()` binds every listening socket (core c listens on each interface at `port + c`,
or on ephemeral ports when `port` is 0), then forks one process per core. Core 0 also answers
discovery: a worker's first connection learns the server's interfaces, cores and endpoints.
`Server.wait()` blocks until the cores exit and returns 0 only if every core did; if one core
fails, the others are stopped.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import selectors
import signal
import socket
import sys
import time
from typing import Dict, List, Optional, Tuple

from . import wire
from .aggregation import ChunkState, JobState, ReadyLane, Result
from .config import Endpoint, JobSpec, ServerConfig
from .errors import ConfigError, ProtocolError
from .hierarchy import HierarchicalJobState, SendPartial, SendPeerInit, SendPeerReady
from .kernels import get_backend
from .optim import optimizer_from_dict
from .transport import Link, LinkClosed

def _log(message: str) -> None:
    print(f"phub server: {message}", file=sys.stderr, flush=True)


class _Job:
    """A job as one core sees it: the aggregation state plus its connections.

    The state is created by the job's first lane HELLO, which says how many shards the workers
    spread the job over and which one this server is (every later HELLO must agree), or, on a
    rack server, by whichever comes first: a worker or another rack.
    """

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.state: Optional[JobState] = None
        self.shard: Tuple[int, int] = (0, 1)  # (this server's index, number of shards)
        self.links: Dict[int, List[Optional[Link]]] = {}  # lane -> link per local worker
        self.peer_links: Dict[int, Link] = {}  # rack -> link to that rack's server (same core)
        self.rack_backlog: Dict[int, list] = {}  # rack -> frames to send once it has connected
        self.said_bye: set = set()  # (lane, local rank) of workers that closed cleanly
        self.racks_done: set = set()  # racks whose server said it has finished the job
        self.ended: Optional[str] = None  # None while running; "" = finished cleanly; else the error
        self.last_progress = time.monotonic()
        self.stall_reported = False

    def live_links(self):
        for lane_links in self.links.values():
            yield from (link for link in lane_links if link is not None and not link.closed)
        yield from (link for link in self.peer_links.values() if not link.closed)


class _Peer:
    """What a server-side connection has proven about itself (nothing until its HELLO)."""

    __slots__ = ("interface", "job", "rank", "local", "lane", "rack")

    def __init__(self, interface: int):
        self.interface = interface
        self.job: Optional[_Job] = None
        self.rank = -1  # the worker's rank in the job (-1: another rack's server)
        self.local = -1  # its index among this server's workers
        self.lane = -1
        self.rack = -1  # another rack's index, on a link between rack servers


class Core:
    """The event loop of one server core (runs in its own process)."""

    def __init__(self, config: ServerConfig, core: int, listeners: List[socket.socket],
                 endpoints: List[List[Endpoint]]):
        self.config = config
        self.core = core
        self.endpoints = endpoints
        self.kernels = get_backend(config.kernels)
        self.jobs: Dict[int, _Job] = {spec.job_id: _Job(spec) for spec in config.jobs}
        self.selector = selectors.DefaultSelector()
        for interface, listener in enumerate(listeners):
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, ("accept", interface))
        self.peers: Dict[Link, _Peer] = {}

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until every job has ended (with `once`) or forever; return the exit status."""
        while not (self.config.once and all(job.ended is not None for job in self.jobs.values())):
            for key, mask in self.selector.select(timeout=1.0):
                if isinstance(key.data, tuple):
                    self._accept(key.fileobj, key.data[1])
                    continue
                link: Link = key.data
                try:
                    link.service(mask)
                except LinkClosed as exc:
                    self._lost(link, str(exc), exc.midframe)
                except ProtocolError as exc:
                    self._bad_peer(link, str(exc))
            self._check_stalls()
        for job in self.jobs.values():  # the other racks may still be reading our last partials
            for link in job.peer_links.values():
                link.flush_blocking(self.config.timeout)
        return 1 if any(job.ended for job in self.jobs.values()) else 0

    def _accept(self, listener: socket.socket, interface: int) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._add_link(sock, _Peer(interface))

    def _add_link(self, sock: socket.socket, peer: _Peer) -> Link:
        link = Link(sock, self.selector, lambda header: self._payload_target(peer, header), self._on_frame)
        self.peers[link] = peer
        return link

    # -- frames -----------------------------------------------------------------------------
    def _payload_target(self, peer: _Peer, header: wire.Header) -> memoryview:
        job = peer.job
        if job is None:
            raise ProtocolError(f"{header.kind.name} data frame before HELLO")
        if peer.rack >= 0:
            wire.check_sender(header, job=job.spec.job_id, sender=peer.rack)
            if header.kind is wire.Kind.PARTIAL:
                return job.state.partial_target(peer.rack, header)
            if header.kind is wire.Kind.INIT:
                return job.state.peer_init_target(peer.rack, header)
            raise ProtocolError(f"a rack server may not send {header.kind.name} frames")
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rank, num_workers=job.spec.total_workers)
        if header.kind is wire.Kind.PUSH:
            return job.state.push_target(peer.local, header, peer.lane)
        if header.kind is wire.Kind.INIT:
            return job.state.init_target(peer.local, header, peer.lane)
        raise ProtocolError(f"a worker may not send {header.kind.name} frames")

    def _on_frame(self, link: Link, frame: wire.Frame) -> None:
        peer = self.peers[link]
        header = frame.header
        kind = header.kind
        job = peer.job
        if kind is wire.Kind.PUSH:  # the hot path first
            job.last_progress = time.monotonic()
            self._act(job, job.state.on_push(peer.local, header))
            return
        if kind is wire.Kind.HELLO:
            self._hello(link, peer, frame.json())
            return
        if job is None:
            raise ProtocolError(f"{kind.name} frame before HELLO")
        job.last_progress = time.monotonic()
        if peer.rack >= 0:
            self._on_rack_frame(job, peer, frame)
            return
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rank, num_workers=job.spec.total_workers)
        if kind is wire.Kind.INIT:
            self._act(job, job.state.on_init(header, peer.lane))
        elif kind is wire.Kind.REGISTER:
            body = frame.json()
            self._act(job, job.state.register(peer.local, peer.lane, body.get("batch"), body.get("arrays", ())))
        elif kind is wire.Kind.OPTIMIZER:
            if peer.local != 0:
                raise ProtocolError(f"OPTIMIZER frame from rank {peer.rank}: only the first worker sets the optimizer")
            try:
                job.state.set_optimizer(peer.lane, optimizer_from_dict(frame.json()))
            except ConfigError as exc:
                raise ProtocolError(f"rank {peer.rank} sent an invalid optimizer: {exc}") from None
        elif kind is wire.Kind.BYE:
            job.said_bye.add((peer.lane, peer.local))
            if len(job.said_bye) == len(job.links) * job.spec.num_workers:
                job.ended = ""
                self._to_racks(job, wire.control_frame(wire.Kind.BYE, job.spec.job_id, self.config.rack, {}))
        elif kind is wire.Kind.ERROR:
            self._fail(job, f"rank {peer.rank} gave up: {frame.json().get('message', '')}")
        else:
            raise ProtocolError(f"a worker may not send {kind.name} frames")

    def _on_rack_frame(self, job: _Job, peer: _Peer, frame: wire.Frame) -> None:
        header = frame.header
        if header.kind is wire.Kind.ERROR:  # whoever it claims to be from: the job is over
            return self._fail(job, f"rack {peer.rack} failed: {frame.json().get('message', '')}")
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rack)
        if header.kind is wire.Kind.PARTIAL:
            self._act(job, job.state.on_partial(peer.rack, header))
        elif header.kind is wire.Kind.INIT:
            self._act(job, job.state.on_peer_init(header))
        elif header.kind is wire.Kind.PEER_READY:
            self._act(job, job.state.on_peer_ready(peer.rack, frame.json().get("batch")))
        elif header.kind is wire.Kind.BYE:
            job.racks_done.add(peer.rack)
        else:
            raise ProtocolError(f"a rack server may not send {header.kind.name} frames")

    def _hello(self, link: Link, peer: _Peer, hello: dict) -> None:
        if peer.job is not None:
            raise ProtocolError("HELLO sent twice on one connection")
        job = self.jobs.get(hello.get("job"))
        if job is None:
            return self._refuse(link, f"job {hello.get('job')!r} is not registered on this server")
        if hello.get("token", "") != job.spec.token:
            return self._refuse(link, f"wrong token for job {job.spec.job_id}")
        if job.ended is not None:
            return self._refuse(link, f"job {job.spec.job_id} has already ended")
        if "peer_rack" in hello:
            return self._rack_hello(link, peer, job, hello)
        spec = job.spec
        rank, lane = hello.get("rank"), hello.get("lane")
        if not isinstance(rank, int) or not spec.first_rank <= rank < spec.first_rank + spec.num_workers:
            return self._refuse(link, f"rank {rank!r} is not one of this server's ranks of job {spec.job_id} "
                                      f"({spec.first_rank}..{spec.first_rank + spec.num_workers - 1})")
        if hello.get("num_workers") != spec.total_workers:
            return self._refuse(link, f"rank {rank} expects {hello.get('num_workers')} workers, "
                                      f"job {spec.job_id} has {spec.total_workers}")
        welcome = {
            "cores": self.config.cores, "interfaces": list(self.config.interfaces),
            "lanes_per_pair": self.config.lanes_per_pair, "chunk_bytes": self.config.chunk_bytes,
            "endpoints": self.endpoints, "first_rank": spec.first_rank,
        }
        if lane == -1:  # discovery only: answer, and let the worker close
            return link.send(wire.control_frame(wire.Kind.WELCOME, spec.job_id, wire.SERVER_SENDER, welcome))
        shard = (hello.get("shard", 0), hello.get("shards", 1))
        if job.state is None:
            error = self._create_state(job, shard)
            if error:
                return self._refuse(link, error)
        elif shard != job.shard:
            return self._refuse(link, f"rank {rank} says this server is shard {shard[0]} of {shard[1]}, "
                                      f"other workers said {job.shard[0]} of {job.shard[1]}")
        topology = job.state.plan.topology
        if lane not in job.links or topology.lane_interface(lane) != peer.interface:
            return self._refuse(link, f"lane {lane!r} is not served on this core/interface")
        local = rank - spec.first_rank
        if job.links[lane][local] is not None:
            return self._refuse(link, f"rank {rank} connected lane {lane} twice")
        peer.job, peer.rank, peer.local, peer.lane = job, rank, local, lane
        job.links[lane][local] = link
        job.last_progress = time.monotonic()
        link.send(wire.control_frame(wire.Kind.WELCOME, spec.job_id, wire.SERVER_SENDER, welcome))

    def _create_state(self, job: _Job, shard) -> Optional[str]:
        """Set up the job on this core; returns an error message instead if the layout is invalid."""
        try:
            if not isinstance(shard[0], int) or not isinstance(shard[1], int) or not 0 <= shard[0] < shard[1]:
                raise ConfigError(f"shard {shard[0]!r} of {shard[1]!r}")
            if self.config.peers and shard != (0, 1):
                raise ConfigError("a rack server cannot also be a shard")
            topology = self.config.topology_with(shard[1])
        except ConfigError as exc:
            return f"invalid shard layout: {exc}"
        args = (job.spec.job_id, job.spec.num_workers, topology, self.config.chunk_bytes, self.core, self.kernels)
        if self.config.peers:
            job.state = HierarchicalJobState(*args, total_workers=job.spec.total_workers,
                                             rack=self.config.rack, racks=self.config.racks)
        else:
            job.state = JobState(*args, server=shard[0], total_workers=job.spec.total_workers)
        job.shard = shard
        job.links = {lane: [None] * job.spec.num_workers for lane in sorted(job.state.lanes)}
        for rack in range(self.config.rack + 1, self.config.racks):  # lower racks call us
            job.peer_links[rack] = self._connect_rack(job, rack)
        return None

    def _connect_rack(self, job: _Job, rack: int) -> Link:
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
        peer = _Peer(-1)
        peer.job, peer.rack = job, rack
        return self._add_link(sock, peer)

    def _rack_hello(self, link: Link, peer: _Peer, job: _Job, hello: dict) -> None:
        rack = hello.get("peer_rack")
        if not self.config.peers or not isinstance(rack, int) or not 0 <= rack < self.config.rack:
            return self._refuse(link, f"unexpected rack server hello from rack {rack!r}")
        if hello.get("core") != self.core or rack in job.peer_links:
            return self._refuse(link, f"rack {rack} connected core {hello.get('core')!r} to core {self.core} twice "
                                      "or to the wrong core")
        if job.state is None:
            self._create_state(job, (0, 1))
        peer.job, peer.rack = job, rack
        job.peer_links[rack] = link
        for parts in job.rack_backlog.pop(rack, ()):
            link.send(*parts)

    # -- sending ----------------------------------------------------------------------------
    def _act(self, job: _Job, events: list) -> None:
        """Carry out what the aggregation state machine asked for."""
        for event in events:
            if isinstance(event, Result):
                self._send_result(job, event.state)
            elif isinstance(event, ReadyLane):
                for state in event.chunks:
                    self._send_result(job, state)
                frame = wire.control_frame(wire.Kind.READY, job.spec.job_id, wire.SERVER_SENDER, {"batch": event.batch})
                for link in job.links[event.lane]:
                    link.send(frame)
            elif isinstance(event, SendPartial):
                header = wire.pack_header(wire.Kind.PARTIAL, job.spec.job_id, self.config.rack,
                                          event.state.chunk.id, event.iteration, event.state.chunk.nbytes)
                self._to_racks(job, header, event.view)
            elif isinstance(event, SendPeerInit):  # to a rack that has connected: it sent PEER_READY
                link = job.peer_links[event.rack]
                for state in event.chunks:
                    link.send(wire.pack_header(wire.Kind.INIT, job.spec.job_id, self.config.rack,
                                               state.chunk.id, 0, state.chunk.nbytes), state.weight_view)
            elif isinstance(event, SendPeerReady):
                self._to_racks(job, wire.control_frame(wire.Kind.PEER_READY, job.spec.job_id, self.config.rack,
                                                       {"batch": event.batch}))

    def _to_racks(self, job: _Job, *parts) -> None:
        """Send to every other rack; a lower rack that has not connected yet gets it when it does
        (nothing it is sent can change before then: rounds need every rack's PEER_READY)."""
        for rack in range(self.config.racks):
            if rack == self.config.rack:
                continue
            if rack in job.peer_links:
                job.peer_links[rack].send(*parts)
            else:
                job.rack_backlog.setdefault(rack, []).append(parts)

    def _send_result(self, job: _Job, state: ChunkState) -> None:
        chunk = state.chunk
        header = wire.pack_header(wire.Kind.RESULT, job.spec.job_id, wire.SERVER_SENDER, chunk.id,
                                  state.rounds, chunk.nbytes)
        view = state.result_view
        for link in job.links[chunk.lane]:
            link.send(header, view)

    # -- failures ---------------------------------------------------------------------------
    def _refuse(self, link: Link, message: str) -> None:
        """Tell a peer that has not joined a job why it is turned away, and drop it."""
        _log(f"core {self.core}: refused a connection: {message}")
        link.send(wire.control_frame(wire.Kind.ERROR, 0, wire.SERVER_SENDER, {"message": message}))
        link.flush_blocking(1.0)
        self._drop(link)

    def _drop(self, link: Link) -> None:
        self.peers.pop(link, None)
        link.close()

    def _bad_peer(self, link: Link, message: str) -> None:
        peer = self.peers.get(link)
        if peer is None or peer.job is None:
            return self._refuse(link, f"protocol error: {message}")
        who = f"rack {peer.rack}'s server" if peer.rack >= 0 else f"rank {peer.rank} (lane {peer.lane})"
        self._fail(peer.job, f"{who} sent a bad frame: {message}")

    def _lost(self, link: Link, reason: str, midframe: bool) -> None:
        peer = self.peers.get(link)
        self._drop(link)
        if peer is None or peer.job is None or peer.job.ended is not None:
            return
        job = peer.job
        if peer.rack >= 0:
            if peer.rack not in job.racks_done or midframe:
                self._fail(job, f"rack {peer.rack}'s server lost: {reason}")
            return
        if (peer.lane, peer.local) in job.said_bye and not midframe:
            return
        self._fail(job, f"worker {peer.rank} lost: lane {peer.lane} {reason}")

    def _fail(self, job: _Job, message: str) -> None:
        if job.ended is not None:
            return
        job.ended = message
        _log(f"core {self.core}: job {job.spec.job_id} failed: {message}")
        frame = wire.control_frame(wire.Kind.ERROR, job.spec.job_id, wire.SERVER_SENDER,
                                   {"message": f"job {job.spec.job_id} failed: {message}"})
        for link in list(job.live_links()):
            link.outq.clear()  # a result cut mid-way is worthless; the error must get through
            link.send(frame)
            link.flush_blocking(1.0)
            self._drop(link)

    def _check_stalls(self) -> None:
        now = time.monotonic()
        for job in self.jobs.values():
            if job.ended is not None or job.state is None or not any(job.live_links()):
                continue
            idle = now - job.last_progress
            pending = job.state.pending()
            waiting = pending or any(link is None for links in job.links.values() for link in links)
            if not waiting or idle < min(30.0, self.config.timeout / 2):
                job.stall_reported = False
                continue
            missing = self._missing(job, pending)
            if idle >= self.config.timeout:
                self._fail(job, f"stalled for {idle:.0f} s waiting for {missing}")
            elif not job.stall_reported:
                job.stall_reported = True
                _log(f"core {self.core}: job {job.spec.job_id} has waited {idle:.0f} s for {missing}")

    @staticmethod
    def _missing(job: _Job, pending: List[ChunkState]) -> str:
        first = job.spec.first_rank
        unconnected = sorted({first + local for links in job.links.values()
                              for local, link in enumerate(links) if link is None})
        if unconnected:
            return f"rank(s) {unconnected} to connect"
        ranks = sorted({first + r for s in pending for r in s.missing(job.spec.num_workers)})
        chunks = sorted(s.chunk.id for s in pending)
        shown = ", ".join(map(str, chunks[:8])) + (" ..." if len(chunks) > 8 else "")
        if not ranks and isinstance(job.state, HierarchicalJobState):
            racks = sorted({r for s in pending for r in job.state.missing_racks(s)})
            return f"rack(s) {racks} to send chunk(s) {shown}"
        return f"rank(s) {ranks} to push chunk(s) {shown}"


def _core_main(config: ServerConfig, core: int, listeners, endpoints) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it terminates us on Ctrl-C
    try:
        status = Core(config, core, listeners, endpoints).run()
    except Exception as exc:  # a bug, not a peer's fault: say so and fail the server
        _log(f"core {core} crashed: {type(exc).__name__}: {exc}")
        raise
    sys.stdout.flush()
    os._exit(status)


class Server:
    """A running PHub server (the cores run in child processes)."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.endpoints: List[List[Endpoint]] = []
        self._processes: List[multiprocessing.Process] = []

    @property
    def address(self) -> str:
        """The discovery address (core 0, first interface) workers pass to `phub.connect`."""
        host, port = self.endpoints[0][0]
        return f"{host}:{port}"

    @property
    def pids(self) -> List[int]:
        """Process ids of the cores."""
        return [p.pid for p in self._processes]

    def start(self) -> "Server":
        """Bind every endpoint and start the cores; OSError names an address that cannot be bound.

        ConfigError (with `phub doctor`'s explanation) if the configured transport cannot run here.
        """
        from .doctor import require_transport  # probes RDMA only when the verbs transport is asked for

        require_transport(self.config.transport)
        listeners: List[List[socket.socket]] = []
        for core in range(self.config.cores):
            row = []
            for address in self.config.interfaces:
                port = self.config.port + core if self.config.port else 0
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((address, port))
                except OSError as exc:
                    raise OSError(f"cannot listen on {address}:{port}: {exc}") from None
                sock.listen(1024)
                row.append(sock)
            listeners.append(row)
        self.endpoints = [[sock.getsockname()[:2] for sock in row] for row in listeners]
        context = multiprocessing.get_context("fork")
        for core, row in enumerate(listeners):
            process = context.Process(target=_core_main, args=(self.config, core, row, self.endpoints),
                                      name=f"phub-core-{core}", daemon=True)
            process.start()
            self._processes.append(process)
        for row in listeners:
            for sock in row:
                sock.close()
        return self

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Block until every core exits (0 if all succeeded) or `timeout` passes (then None).

        A core that fails makes the others stop at once: the job state is split across cores.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        running = list(self._processes)
        while running:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait([p.sentinel for p in running], timeout=left)
            if not ready:
                return None
            for process in [p for p in running if p.sentinel in ready]:
                process.join()
                running.remove(process)
                if process.exitcode != 0:
                    _log(f"{process.name} exited with status {process.exitcode}; stopping the server")
                    self.stop()
                    return 1
        return 0

    def stop(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
