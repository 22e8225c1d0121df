"""One server core: the event loop that owns a disjoint set of chunks and serves their lanes.

Each core runs in its own process (see server.py). It accepts connections on every interface,
admits workers into jobs (HELLO: job id, token, rank, lane), feeds their frames to the job's
aggregation state machine (aggregation.py, or hierarchy.py for a rack server) and carries out
the events it returns: results to the workers, partials to the other racks. A lost or
misbehaving worker fails its job, and every other connection of that job is told why; so does a
worker that said BYE (its work done) while the others push a round it will never join.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from typing import Dict, List, Optional

from . import messages, wire
from .aggregation import ChunkState, JobState, ReadyLane, Result
from .config import Endpoint, ServerConfig
from .errors import ConfigError, JobFailed, ProtocolError
from .hierarchy import HierarchicalJobState, SendPartial, SendPeerInit, SendPeerReady
from .kernels import for_owned_buffers, get_backend
from .admission import Admission
from .racklinks import RackLinks
from .rdma.serving import CoreVerbs
from .session import Job, Peer, RefusalLog
from .transport import Link, LinkClosed, StagedLink, flush_links, staging_capacity

try:
    from ._fastpath import drain_pushes
except ImportError:  # not built: every frame takes the Python path
    drain_pushes = None

_PUSH = wire.Kind.PUSH


def _log(message: str) -> None:
    print(f"phub server: {message}", file=sys.stderr, flush=True)


def _share_frame(job: Job, name: str, value) -> bytes:
    return wire.control_frame(wire.Kind.SHARE, job.spec.job_id, wire.SERVER_SENDER, {"name": name, "value": value})


class Core(Admission, RackLinks):
    """The event loop of one server core (runs in its own process)."""

    def __init__(self, config: ServerConfig, core: int, listeners: List[socket.socket],
                 endpoints: List[List[Endpoint]]):
        self.config = config
        self.core = core
        self.endpoints = endpoints
        self.kernels = for_owned_buffers(get_backend("auto"))  # every buffer it updates is its own
        self.jobs: Dict[int, Job] = {spec.job_id: Job(spec) for spec in config.jobs}
        self.selector = selectors.DefaultSelector()
        for interface, listener in enumerate(listeners):
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, ("accept", interface))
        self.peers: Dict[Link, Peer] = {}
        self.outbox: List[Link] = []  # links with output queued in this loop iteration
        self.limits = messages.Limits(frozenset(self.jobs), config.cores, config.racks, config.chunk_bytes,
                                      config.max_job_bytes)
        self.pending: Dict[str, int] = {}  # remote address -> its connections not yet authenticated
        self.refusals = RefusalLog(lambda message: _log(f"core {core}: {message}"))
        self._next_sweep = time.monotonic() + 1.0
        # Pushes go through the C loop when it is built and the kernels are the C ones (it folds
        # with the same loops); the reference kernels keep every frame on the Python path.
        self._fast_pushes_on = drain_pushes is not None and self.kernels.name == "fast" and config.transport == "tcp"

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until every job has ended (with `once`) or forever; return the exit status."""
        while not (self.config.once and all(job.ended is not None for job in self.jobs.values())):
            for key, mask in self.selector.select(timeout=self._nap()):
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
                except JobFailed as exc:  # the RDMA work this frame asked for could not be done
                    peer = self.peers.get(link)
                    if peer is not None and peer.job is not None:
                        self._fail(peer.job, f"RDMA data path: {exc}")
                except Exception as exc:  # a bug a peer's bytes reached: it may end that job, never the core
                    self._bad_peer(link, f"the server could not handle it ({type(exc).__name__}: {exc})"[:400])
            self._poll_verbs()
            flush_links(self.outbox)
            self._check_stalls()
            self._sweep_pending()
        for job in self.jobs.values():  # the other racks may still be reading our last partials
            for link in job.peer_links.values():
                link.flush_blocking(self.config.timeout)
        return 1 if any(job.ended for job in self.jobs.values()) else 0

    def _nap(self) -> float:
        """How long the loop may wait for sockets: a second, or the RDMA provider's polling gap."""
        return min([job.verbs.nap for job in self.jobs.values() if job.verbs and job.ended is None] or [1.0])

    def _poll_verbs(self) -> None:
        for job in self.jobs.values():
            if job.verbs is None or job.ended is not None:
                continue
            try:
                for local, lane, header in job.verbs.poll():
                    job.last_progress = time.monotonic()
                    events = job.state.on_push(local, header)
                    if events:
                        self._act(job, events)
                    if job.said_bye and self._check_stranded(job, lane, (job.state.owned[header.chunk],)):
                        break
            except (ProtocolError, JobFailed) as exc:
                self._fail(job, f"RDMA data path: {exc}")

    def _add_link(self, sock: socket.socket, peer: Peer) -> Link:
        target = lambda header: self._payload_target(peer, header)  # noqa: E731
        if self._fast_pushes_on:
            link = StagedLink(sock, self.selector, target, self._on_frame, self.outbox, self._fast_pushes,
                              staging_capacity(self.config.chunk_bytes))
        else:
            link = Link(sock, self.selector, target, self._on_frame, self.outbox)
        self.peers[link] = peer
        return link

    def _fast_pushes(self, link: Link, staging: memoryview, start: int, end: int):
        """The C loop over a staged link's pushes (see transport.StagedLink); a worker's link only."""
        peer = self.peers[link]
        job = peer.job
        if job is None or peer.rack >= 0 or job.state is None or job.verbs is not None or job.ended is not None:
            return start, True
        state = job.state
        completed: list = []
        offset, at_frame = drain_pushes(staging, start, end, job.spec.job_id, peer.rank, peer.lane, peer.local,
                                        state.num_workers, state.fast_table, state.fast_states, completed)
        if offset != start:
            job.last_progress = time.monotonic()
            if state.finishes_rounds_here:  # one rack: optimize and send back, no events to sort
                finish, send = state.finish_round, self._send_result
                for chunk, acc, last in completed:
                    finish(chunk, acc, last)
                    send(job, chunk)
            else:
                for chunk, acc, last in completed:
                    self._act(job, state._local_round_done(chunk, acc, last))
            if job.said_bye and job.ended is None:  # a worker has left: these rounds may never complete
                self._check_stranded(job, peer.lane, state.pending())
        return offset, at_frame

    # -- frames -----------------------------------------------------------------------------
    def _payload_target(self, peer: Peer, header: wire.Header) -> memoryview:
        job = peer.job
        # The hot path: a push from the connection's own worker (what check_sender checks, as
        # the rank was checked against the job at HELLO); anything else takes the full checks.
        if header.kind is _PUSH and job is not None and header.sender == peer.rank \
                and header.job == job.spec.job_id and peer.rack < 0:
            return job.state.push_target(peer.local, header, peer.lane)
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
        if header.kind is wire.Kind.STATE:
            return job.state.state_target(peer.local, header, peer.lane)
        raise ProtocolError(f"a worker may not send {header.kind.name} frames")

    def _on_frame(self, link: Link, frame: wire.Frame) -> None:
        peer = self.peers[link]
        header = frame.header
        kind = header.kind
        job = peer.job
        if kind is _PUSH:  # the hot path first
            job.last_progress = time.monotonic()
            events = job.state.on_push(peer.local, header)
            if events:
                self._act(job, events)
            if job.said_bye:  # a worker has left: this round may never complete
                self._check_stranded(job, peer.lane, (job.state.owned[header.chunk],))
            return
        if kind is wire.Kind.HELLO:
            self._hello(link, peer, frame.json())
            return
        if peer.pending:  # a discovery connection may say nothing more
            raise ProtocolError(f"{kind.name} frame before HELLO")
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
            self._register(job, peer, frame.json())
        elif kind is wire.Kind.OPTIMIZER:
            if peer.local != 0:
                raise ProtocolError(f"OPTIMIZER frame from rank {peer.rank}: only the first worker sets the optimizer")
            job.state.set_optimizer(peer.lane, messages.optimizer(frame.json()))
            if job.verbs:  # the leader's next pushes wait for this: RDMA writes do not queue behind it
                link.send(wire.control_frame(wire.Kind.OPTIMIZER, job.spec.job_id, wire.SERVER_SENDER, {}))
        elif kind is wire.Kind.BYE:
            job.said_bye.add((peer.lane, peer.local))
            if self._check_stranded(job, peer.lane, job.state.pending()):
                return
            if len(job.said_bye) == len(job.links) * job.spec.num_workers:
                job.ended = ""
                self._to_racks(job, wire.control_frame(wire.Kind.BYE, job.spec.job_id, self.config.rack, {}))
        elif kind is wire.Kind.STATE:
            pass  # a checkpointed momentum, already in place (JobState.state_target)
        elif kind is wire.Kind.STATE_REQUEST:
            for state in job.state.lane_states(peer.lane):  # copies: a round may complete before they leave
                mom = state.mom.tobytes() if state.mom is not None else bytes(state.chunk.nbytes)
                link.send(wire.pack_header(wire.Kind.STATE, job.spec.job_id, wire.SERVER_SENDER, state.chunk.id,
                                           state.rounds, state.chunk.nbytes), mom)
        elif kind is wire.Kind.SHARE:
            if peer.rank != 0 or peer.lane != 0:
                raise ProtocolError(f"SHARE frame from rank {peer.rank} on lane {peer.lane}: only rank 0 shares, "
                                    "on lane 0")
            name, value = messages.share(frame.json())
            self._share(job, name, value)
            self._to_racks(job, wire.control_frame(wire.Kind.SHARE, job.spec.job_id, self.config.rack,
                                                   {"name": name, "value": value}))
        elif kind is wire.Kind.ERROR:
            self._fail(job, f"rank {peer.rank} gave up: {messages.error_message(frame.json())}")
        else:
            raise ProtocolError(f"a worker may not send {kind.name} frames")

    def _share(self, job: Job, name: str, value) -> None:
        """Keep rank 0's value and hand it to every worker on lane 0 (to later ones when they connect)."""
        if name in job.shared:
            raise ProtocolError(f"SHARE: {name!r} was shared already")
        job.shared[name] = value
        frame = _share_frame(job, name, value)
        for link in job.links.get(0, ()):
            if link is not None:
                link.send(frame)

    def _register(self, job: Job, peer: Peer, body: dict) -> None:
        new = body.get("batch") == len(job.state.plan.batches)  # a batch registered before costs nothing again
        budget = self.config.max_job_bytes - job.registered_bytes if new else self.config.max_job_bytes
        register = messages.register(body, self.limits, budget)
        try:
            events = job.state.register(peer.local, peer.lane, register.batch, register.arrays)
        except MemoryError:
            raise ProtocolError(f"REGISTER: this server has no memory for batch {register.batch} "
                                f"({register.cost} bytes)") from None
        if new:
            job.registered_bytes += register.cost
        if job.verbs:  # the batch is laid out now: its region can be checked
            job.verbs.registered(peer.lane, peer.local, register.batch, body)
        self._act(job, events)

    def _hello(self, link: Link, peer: Peer, body: dict) -> None:
        if peer.greeted or not peer.pending:  # also after a discovery: its WELCOME is not sent twice
            raise ProtocolError("HELLO sent twice on one connection")
        peer.greeted = True
        hello = messages.hello(body, self.limits)  # every field typed and bounded before it is used
        job = self.jobs[hello.job]
        refusal = job.refusal(hello)
        if refusal:
            return self._refuse(link, refusal)
        if hello.peer_rack is not None:
            return self._rack_hello(link, peer, job, hello)
        spec = job.spec
        rank, lane = hello.rank, hello.lane
        welcome = {
            "cores": self.config.cores, "interfaces": list(self.config.interfaces),
            "lanes_per_pair": self.config.lanes_per_pair, "chunk_bytes": self.config.chunk_bytes,
            "endpoints": self.endpoints, "first_rank": spec.first_rank, "workers_here": spec.num_workers,
            "transport": self.config.transport,
        }
        if lane == -1:  # discovery only: answer, and let the worker close
            return link.send(wire.control_frame(wire.Kind.WELCOME, spec.job_id, wire.SERVER_SENDER, welcome))
        if job.state is None:
            error = self._create_state(job, hello.shard)
            if error:
                return self._refuse(link, error)
        refusal = job.lane_refusal(hello, peer.interface)
        if refusal:
            return self._refuse(link, refusal)
        local = rank - spec.first_rank
        if job.verbs:
            try:
                welcome["rdma"] = job.verbs.hello(peer.interface, lane, local, rank, body)
            except (ProtocolError, JobFailed, ConfigError) as exc:
                return self._refuse(link, f"rank {rank} lane {lane}: RDMA connection failed: {exc}")
        peer.job, peer.rank, peer.local, peer.lane = job, rank, local, lane
        self._admitted(link, peer)
        job.links[lane][local] = link
        job.last_progress = time.monotonic()
        if self.config.report_joins and rank not in job.joined:  # the launcher learns who connected
            print(json.dumps({"event": "joined", "job": spec.job_id, "rank": rank}), flush=True)
        job.joined.add(rank)
        link.send(wire.control_frame(wire.Kind.WELCOME, spec.job_id, wire.SERVER_SENDER, welcome))
        if lane == 0:  # what rank 0 shared before this worker connected
            for name, value in job.shared.items():
                link.send(_share_frame(job, name, value))

    def _create_state(self, job: Job, shard) -> Optional[str]:
        """Set up the job on this core; returns an error message instead if the layout is invalid."""
        try:
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
        if self.config.transport != "tcp":
            job.verbs = CoreVerbs(self.config.transport, job.state, dict(enumerate(self.config.rdma_devices)))
        job.shard = shard
        job.links = {lane: [None] * job.spec.num_workers for lane in sorted(job.state.lanes)}
        for rack in range(self.config.rack + 1, self.config.racks):  # lower racks call us
            try:
                job.peer_links[rack] = self._connect_rack(job, rack)
            except ConfigError as exc:  # the job cannot run without that rack: it fails, the core serves on
                self._fail(job, str(exc))
                return str(exc)
        return None

    # -- sending ----------------------------------------------------------------------------
    def _act(self, job: Job, events: list) -> None:
        """Carry out what the aggregation state machine asked for."""
        for event in events:
            if isinstance(event, Result):
                self._send_result(job, event.state)
            elif isinstance(event, ReadyLane):
                for state in event.chunks:
                    self._send_result(job, state)
                ready = {"batch": event.batch}
                frame = wire.control_frame(wire.Kind.READY, job.spec.job_id, wire.SERVER_SENDER, ready)
                for local, link in enumerate(job.links[event.lane]):
                    if job.verbs:  # each worker learns where its slots are
                        ready["rdma"] = job.verbs.ready_params(event.lane, local, event.batch)
                        frame = wire.control_frame(wire.Kind.READY, job.spec.job_id, wire.SERVER_SENDER, ready)
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

    def _send_result(self, job: Job, state: ChunkState) -> None:
        if job.verbs:
            return job.verbs.send_result(state)
        chunk = state.chunk
        header = wire.pack_header(wire.Kind.RESULT, job.spec.job_id, wire.SERVER_SENDER, chunk.id,
                                  state.rounds, chunk.nbytes)
        view = state.result_view
        for link in job.links[chunk.lane]:
            link.send(header, view)

    # -- failures ---------------------------------------------------------------------------
    def _refuse(self, link: Link, message: str) -> None:
        """Tell a peer that has not joined a job why it is turned away, and drop it."""
        self.refusals.refused(message)
        link.send(wire.control_frame(wire.Kind.ERROR, 0, wire.SERVER_SENDER, {"message": message}))
        link.flush_blocking(1.0)
        self._drop(link)

    def _drop(self, link: Link) -> None:
        peer = self.peers.pop(link, None)
        if peer is not None:
            self._unpend(peer)
        link.close()

    def _bad_peer(self, link: Link, message: str) -> None:
        peer = self.peers.get(link)
        if peer is None or peer.job is None:
            return self._refuse(link, f"protocol error: {message}")
        if peer.job.ended is not None:  # a late frame of a job that is over: nobody to tell
            return self._drop(link)
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

    def _check_stranded(self, job: Job, lane: int, states) -> bool:
        """Fail the job if a round of `lane` waits for a worker that said BYE (Job.stranded)."""
        message = job.stranded(lane, states)
        if message:
            self._fail(job, message)
        return bool(message)

    def _fail(self, job: Job, message: str) -> None:
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
        if job.verbs is None:  # nothing reads a failed job's arrays again: free them
            job.state = None

    def _check_stalls(self) -> None:
        now = time.monotonic()
        for job in self.jobs.values():
            if job.ended is None and job.state is None and self.config.once and \
                    now - job.last_progress >= self.config.timeout:  # nobody ever came: end, naming who
                first = job.spec.first_rank
                self._fail(job, f"no worker connected within {self.config.timeout:g} s: rank(s) "
                                f"{list(range(first, first + job.spec.num_workers))} never did")
                continue
            if job.ended is not None or job.state is None or not any(job.live_links()):
                continue
            idle = now - job.last_progress
            if idle < min(30.0, self.config.timeout / 2):  # checked first: pending() visits every chunk
                job.stall_reported = False
                continue
            pending = job.state.pending()
            if not pending and all(link is not None for links in job.links.values() for link in links):
                job.stall_reported = False
                continue
            missing = job.missing(pending)
            if idle >= self.config.timeout:
                self._fail(job, f"stalled for {idle:.0f} s waiting for {missing}")
            elif not job.stall_reported:
                job.stall_reported = True
                _log(f"core {self.core}: job {job.spec.job_id} has waited {idle:.0f} s for {missing}")
