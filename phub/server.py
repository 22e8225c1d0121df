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
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import wire
from .aggregation import ChunkState, JobState, ReadyLane
from .chunking import DEFAULT_CHUNK_BYTES, Topology, chunk_elements
from .errors import ConfigError, ProtocolError
from .kernels import get_backend
from .optim import optimizer_from_dict
from .transport import Link, LinkClosed

Endpoint = Tuple[str, int]


@dataclass(frozen=True)
class JobSpec:
    """A job the server accepts: its id, how many workers it has, and the token they present."""

    job_id: int = 0
    num_workers: int = 1
    token: str = ""

    def __post_init__(self):
        if not isinstance(self.job_id, int) or not 0 <= self.job_id < 2**32:
            raise ConfigError(f"JobSpec.job_id must be an integer in [0, 2**32), got {self.job_id!r}")
        if not isinstance(self.num_workers, int) or not 1 <= self.num_workers <= 4096:
            raise ConfigError(f"JobSpec.num_workers must be an integer in [1, 4096], got {self.num_workers!r}")
        if not isinstance(self.token, str):
            raise ConfigError("JobSpec.token must be a string")

    @classmethod
    def parse(cls, text: str) -> "JobSpec":
        """`ID:WORKERS[:TOKEN]`, as the `--job` option takes it."""
        parts = text.split(":", 2)
        try:
            return cls(int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "")
        except (IndexError, ValueError):
            raise ConfigError(f"--job {text!r}: expected ID:WORKERS[:TOKEN]") from None


@dataclass(frozen=True)
class ServerConfig:
    """Validated server parameters. `timeout` bounds how long a job may stall before it is failed."""

    jobs: Tuple[JobSpec, ...] = (JobSpec(),)
    interfaces: Tuple[str, ...] = ("127.0.0.1",)
    cores: int = 1
    port: int = 0
    lanes_per_pair: int = 1
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    once: bool = False  # exit when every job has ended (what the launcher wants)
    timeout: float = 300.0
    kernels: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "jobs", tuple(self.jobs))
        object.__setattr__(self, "interfaces", tuple(self.interfaces))
        if not self.jobs:
            raise ConfigError("ServerConfig.jobs: at least one job is needed")
        ids = [j.job_id for j in self.jobs]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"ServerConfig.jobs: job ids must be distinct, got {ids}")
        if not self.interfaces or len(set(self.interfaces)) != len(self.interfaces):
            raise ConfigError(f"ServerConfig.interfaces must be distinct addresses, got {list(self.interfaces)}")
        for address in self.interfaces:
            try:
                socket.inet_aton(address)
            except OSError:
                raise ConfigError(f"ServerConfig.interfaces: {address!r} is not an IPv4 address") from None
        Topology(len(self.interfaces), self.cores, self.lanes_per_pair)  # validates both counts
        if not isinstance(self.port, int) or not 0 <= self.port < 65536 - self.cores:
            raise ConfigError(f"ServerConfig.port must be 0 (ephemeral) or a free base port, got {self.port!r}")
        chunk_elements(self.chunk_bytes)
        if not self.timeout > 0:
            raise ConfigError(f"ServerConfig.timeout must be > 0 seconds, got {self.timeout!r}")

    @property
    def topology(self) -> Topology:
        return Topology(len(self.interfaces), self.cores, self.lanes_per_pair)


def _log(message: str) -> None:
    print(f"phub server: {message}", file=sys.stderr, flush=True)


class _Job:
    """A job as one core sees it: the aggregation state plus the connections of its lanes."""

    def __init__(self, spec: JobSpec, state: JobState, lanes: List[int]):
        self.spec = spec
        self.state = state
        self.links: Dict[int, List[Optional[Link]]] = {lane: [None] * spec.num_workers for lane in lanes}
        self.said_bye: set = set()  # (lane, rank)
        self.ended: Optional[str] = None  # None while running; "" = finished cleanly; else the error
        self.last_progress = time.monotonic()
        self.stall_reported = False

    def live_links(self):
        for lane_links in self.links.values():
            yield from (link for link in lane_links if link is not None and not link.closed)


class _Peer:
    """What a server-side connection has proven about itself (nothing until its HELLO)."""

    __slots__ = ("interface", "job", "rank", "lane")

    def __init__(self, interface: int):
        self.interface = interface
        self.job: Optional[_Job] = None
        self.rank = -1
        self.lane = -1


class Core:
    """The event loop of one server core (runs in its own process)."""

    def __init__(self, config: ServerConfig, core: int, listeners: List[socket.socket],
                 endpoints: List[List[Endpoint]]):
        self.config = config
        self.core = core
        self.endpoints = endpoints
        self.topology = config.topology
        self.lanes = self.topology.core_lanes(core)
        kernels = get_backend(config.kernels)
        self.jobs: Dict[int, _Job] = {
            spec.job_id: _Job(spec, JobState(spec.job_id, spec.num_workers, self.topology,
                                             config.chunk_bytes, core, kernels), self.lanes)
            for spec in config.jobs
        }
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
        failed = [job for job in self.jobs.values() if job.ended]
        return 1 if failed else 0

    def _accept(self, listener: socket.socket, interface: int) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        peer = _Peer(interface)
        link = Link(sock, self.selector, lambda header: self._payload_target(peer, header), self._on_frame)
        self.peers[link] = peer

    # -- frames -----------------------------------------------------------------------------
    def _payload_target(self, peer: _Peer, header: wire.Header) -> memoryview:
        if peer.job is None:
            raise ProtocolError(f"{header.kind.name} data frame before HELLO")
        wire.check_sender(header, job=peer.job.spec.job_id, sender=peer.rank, num_workers=peer.job.spec.num_workers)
        if header.kind is wire.Kind.PUSH:
            return peer.job.state.push_target(header, peer.lane)
        if header.kind is wire.Kind.INIT:
            return peer.job.state.init_target(header, peer.lane)
        raise ProtocolError(f"a worker may not send {header.kind.name} frames")

    def _on_frame(self, link: Link, frame: wire.Frame) -> None:
        peer = self.peers[link]
        header = frame.header
        kind = header.kind
        if kind is wire.Kind.PUSH:
            job = peer.job
            job.last_progress = time.monotonic()
            state = job.state.on_push(header)
            if state is not None:
                self._send_result(job, state)
            return
        if kind is wire.Kind.HELLO:
            self._hello(link, peer, frame.json())
            return
        job = peer.job
        if job is None:
            raise ProtocolError(f"{kind.name} frame before HELLO")
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rank, num_workers=job.spec.num_workers)
        job.last_progress = time.monotonic()
        if kind is wire.Kind.INIT:
            self._send_ready(job, job.state.on_init(header, peer.lane))
        elif kind is wire.Kind.REGISTER:
            body = frame.json()
            self._send_ready(job, job.state.register(peer.rank, peer.lane, body.get("batch"), body.get("arrays", ())))
        elif kind is wire.Kind.OPTIMIZER:
            if peer.rank != 0:
                raise ProtocolError(f"OPTIMIZER frame from rank {peer.rank}: only rank 0 sets the optimizer")
            try:
                job.state.set_optimizer(peer.lane, optimizer_from_dict(frame.json()))
            except ConfigError as exc:
                raise ProtocolError(f"rank 0 sent an invalid optimizer: {exc}") from None
        elif kind is wire.Kind.BYE:
            job.said_bye.add((peer.lane, peer.rank))
            if len(job.said_bye) == len(self.lanes) * job.spec.num_workers:
                job.ended = ""
        elif kind is wire.Kind.ERROR:
            message = frame.json().get("message", "")
            self._fail(job, f"rank {peer.rank} gave up: {message}")
        else:
            raise ProtocolError(f"a worker may not send {kind.name} frames")

    def _hello(self, link: Link, peer: _Peer, hello: dict) -> None:
        if peer.job is not None:
            raise ProtocolError("HELLO sent twice on one connection")
        job = self.jobs.get(hello.get("job"))
        if job is None:
            self._refuse(link, f"job {hello.get('job')!r} is not registered on this server")
            return
        if hello.get("token", "") != job.spec.token:
            self._refuse(link, f"wrong token for job {job.spec.job_id}")
            return
        if job.ended is not None:
            self._refuse(link, f"job {job.spec.job_id} has already ended")
            return
        rank, lane = hello.get("rank"), hello.get("lane")
        if not isinstance(rank, int) or not 0 <= rank < job.spec.num_workers:
            self._refuse(link, f"rank {rank!r} is outside job {job.spec.job_id}'s {job.spec.num_workers} workers")
            return
        if hello.get("num_workers") != job.spec.num_workers:
            self._refuse(link, f"rank {rank} expects {hello.get('num_workers')} workers, "
                               f"job {job.spec.job_id} has {job.spec.num_workers}")
            return
        welcome = {
            "cores": self.config.cores,
            "interfaces": list(self.config.interfaces),
            "lanes_per_pair": self.config.lanes_per_pair,
            "chunk_bytes": self.config.chunk_bytes,
            "endpoints": self.endpoints,
        }
        if lane == -1:  # discovery only: answer, and let the worker close
            link.send(wire.control_frame(wire.Kind.WELCOME, job.spec.job_id, wire.SERVER_SENDER, welcome))
            return
        if lane not in job.links or self.topology.lane_interface(lane) != peer.interface:
            self._refuse(link, f"lane {lane!r} is not served on this core/interface")
            return
        if job.links[lane][rank] is not None:
            self._refuse(link, f"rank {rank} connected lane {lane} twice")
            return
        peer.job, peer.rank, peer.lane = job, rank, lane
        job.links[lane][rank] = link
        job.last_progress = time.monotonic()
        link.send(wire.control_frame(wire.Kind.WELCOME, job.spec.job_id, wire.SERVER_SENDER, welcome))

    # -- sending ----------------------------------------------------------------------------
    def _send_result(self, job: _Job, state: ChunkState) -> None:
        chunk = state.chunk
        header = wire.pack_header(wire.Kind.RESULT, job.spec.job_id, wire.SERVER_SENDER, chunk.id,
                                  state.rounds, chunk.nbytes)
        view = state.result_view
        for link in job.links[chunk.lane]:
            try:
                link.send(header, view)
            except LinkClosed as exc:
                self._lost(link, str(exc), True)
                return

    def _send_ready(self, job: _Job, ready: Optional[ReadyLane]) -> None:
        if ready is None:
            return
        for state in ready.chunks:
            self._send_result(job, state)
        frame = wire.control_frame(wire.Kind.READY, job.spec.job_id, wire.SERVER_SENDER, {"batch": ready.batch})
        for link in job.links[ready.lane]:
            link.send(frame)

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
            self._refuse(link, f"protocol error: {message}")
            return
        self._fail(peer.job, f"rank {peer.rank} (lane {peer.lane}) sent a bad frame: {message}")

    def _lost(self, link: Link, reason: str, midframe: bool) -> None:
        peer = self.peers.get(link)
        self._drop(link)
        if peer is None or peer.job is None or peer.job.ended is not None:
            return
        job = peer.job
        if (peer.lane, peer.rank) in job.said_bye and not midframe:
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
            if job.ended is not None or not any(job.live_links()):
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
        unconnected = sorted({rank for links in job.links.values() for rank, link in enumerate(links) if link is None})
        if unconnected:
            return f"rank(s) {unconnected} to connect"
        ranks = sorted({r for s in pending for r in s.missing(job.spec.num_workers)})
        chunks = sorted(s.chunk.id for s in pending)
        shown = ", ".join(map(str, chunks[:8])) + (" ..." if len(chunks) > 8 else "")
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
        """Bind every endpoint and start the cores; OSError names an address that cannot be bound."""
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
