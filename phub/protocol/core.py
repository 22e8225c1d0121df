"""The protocol of one server core, with no I/O: what each frame means and what goes back.

`CoreProtocol` is handed connections (objects that queue bytes: `send`, `finish`, `close`; a
`links.Link` in a server, `phub.protocol.testing.MemoryConnection` in a test) and the frames that
arrive on them; it answers by sending on them. The core's loop (`phub.server.coreloop`) only moves bytes:

    connection_made(conn, interface, address)    a worker or another rack connected (or refuse)
    payload_target(conn, header) -> memoryview   where a data frame's payload must land
    frame_received(conn, frame)                  a whole frame arrived
    fast_pushes(conn, staging, start, end)       many pushes at once, in C (a staged TCP link)
    connection_lost(conn, reason, midframe)      / bad_frame(conn, why) / data_path_failed(...)
    poll_data_paths(); tick()                    RDMA completions; stalls and deadlines

Every transition of a core's connections is in this one file on purpose (as h11 keeps its state
machine in one module): what a frame may do is read in one place, not across mixins.

A connection's life: accepted (a stranger: small frames only, a deadline) -> HELLO (typed and
bounded by `messages.hello`, then `Job.refusal` / `Job.lane_refusal`) -> WELCOME, or ERROR and
closed -> REGISTER / INIT / OPTIMIZER / PUSH ... (the job's aggregation state machine,
reduction/aggregation.py or reduction/hierarchy.py, decides; its events become RESULT / READY /
PARTIAL / TOTAL frames) -> BYE (the worker is done) or a failure. A failure of any connection of a job fails the job:
every connection of it gets an ERROR naming the cause and is closed; the core serves on.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Callable, Dict, Optional

from . import messages, wire
from ..reduction.aggregation import ChunkState, JobState, ReadyLane, Result
from ..config import ServerConfig, check_peer
from ..network.datapath import server_path, server_path_class
from ..errors import ConfigError, JobFailed, ProtocolError
from ..network.fastpath_contract import fastpath
from ..reduction.hierarchy import (HierarchicalJobState, SendPartial, SendPeerInit, SendPeerReady, SendTotal,
                                   SimulatedRacksJobState)
from .admission import HANDSHAKE_SECONDS, Strangers
from .jobs import QUEUE_SLACK, Job, Peer, RefusalLog

# The C loops, their round contract registered (phub/network/fastpath_contract.py); None when not built:
# every frame takes the Python path.
drain_pushes = drain_rack_frames = rack_rounds_done = None
if fastpath is not None:
    drain_pushes, drain_rack_frames, rack_rounds_done = (fastpath.drain_pushes, fastpath.drain_rack_frames,
                                                         fastpath.rack_rounds_done)

_PUSH = wire.Kind.PUSH
_SERVER = wire.SERVER_SENDER


def _stderr(message: str) -> None:
    print(f"phub server: {message}", file=sys.stderr, flush=True)


def _stdout_json(event: dict) -> None:
    print(json.dumps(event), flush=True)


class CoreProtocol:
    """Every job of one server core, and every connection to it.

    `open_connection(address, source)` opens a connection from this server's address `source` to
    another rack's server at `address` (for two-phase reduction; it may block until that server
    listens and raises ConfigError if it never does);
    `log` takes the core's log lines, `report` the events a launcher reads (a rank joined);
    `clock` is the monotonic clock every deadline is measured on.
    """

    def __init__(self, config: ServerConfig, core: int, endpoints, kernels,
                 open_connection: Optional[Callable] = None, log: Callable[[str], None] = _stderr,
                 report: Callable[[dict], None] = _stdout_json, clock: Callable[[], float] = time.monotonic):
        self.config, self.core, self.endpoints, self.kernels = config, core, endpoints, kernels
        self.open_connection, self.report, self.clock = open_connection, report, clock
        self.log = lambda message: log(f"core {core}: {message}")
        now = clock()
        self.jobs: Dict[int, Job] = {spec.job_id: Job(spec, now) for spec in config.jobs}
        self.peers: Dict[object, Peer] = {}  # connection -> what it has proven about itself
        self.strangers = Strangers()
        self.refusals = RefusalLog(self.log, now=now)
        self.limits = messages.Limits(frozenset(self.jobs), config.cores, config.racks, config.chunk_bytes,
                                      config.max_job_bytes, interfaces=len(config.interfaces))
        self._next_sweep = now + 1.0
        # Pushes may go through the C loop when it is built, the kernels are the C ones (it folds
        # with the same loops) and they travel as frames; else every frame takes the Python path.
        self.fast_pushes_on = drain_pushes is not None and kernels.name == "fast" and \
            server_path_class(config.transport).frames_carry_pushes

    # -- the loop's questions ----------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every job has ended and the core serves only those (`once`): the loop may stop."""
        return self.config.once and all(job.ended is not None for job in self.jobs.values())

    @property
    def exit_status(self) -> int:
        return 1 if any(job.ended for job in self.jobs.values()) else 0

    @property
    def nap(self) -> float:
        """How long the loop may wait for sockets: a second, or the shortest data path's polling gap."""
        return min([job.data.nap for job in self.jobs.values()
                    if job.data is not None and job.data.nap is not None and job.ended is None] or [1.0])

    def rack_connections(self):
        """The connections to other racks' servers (still reading our last partials at the end)."""
        return [conn for job in self.jobs.values() for conn in job.peer_links.values()]

    # -- connections -----------------------------------------------------------------------
    def refusal(self, address: str) -> Optional[str]:
        """Why a connection from `address` is refused before it is even read (logged), or None."""
        message = self.strangers.refusal(address)
        if message:
            self.refusals.refused(message)
        return message

    def connection_made(self, conn, interface: int, address: str) -> None:
        """A stranger connected on `interface`: small control frames only until its HELLO."""
        peer = self.peers[conn] = Peer(interface, address, self.clock())
        conn.limit_control(wire.HANDSHAKE_CONTROL_BYTES)  # no big allocation before a HELLO
        conn.limit_queue(QUEUE_SLACK)  # a peer that does not read what it is sent is dropped
        self.strangers.arrived(peer)

    def connection_lost(self, conn, reason: str, midframe: bool) -> None:
        peer = self.peers.get(conn)
        self._drop(conn)
        if peer is None or peer.job is None or peer.job.ended is not None:
            return
        job = peer.job
        if peer.rack >= 0:
            if (peer.rack, peer.interface) not in job.racks_done or midframe:
                self._fail(job, f"rack {peer.rack}'s server lost ({_rack_link(peer, self.core)}): {reason}")
            return
        if (peer.lane, peer.local) in job.said_bye and not midframe:
            return
        self._fail(job, f"worker {peer.rank} lost: lane {peer.lane} {reason}", peer.rank)

    def bad_frame(self, conn, message: str) -> None:
        """The connection sent something that breaks the protocol (or that the server could not handle)."""
        peer = self.peers.get(conn)
        if peer is None or peer.job is None:
            return self._refuse(conn, f"protocol error: {message}")
        if peer.job.ended is not None:  # a late frame of a job that is over: nobody to tell
            return self._drop(conn)
        if peer.rack >= 0:
            return self._fail(peer.job, f"rack {peer.rack}'s server sent a bad frame ({_rack_link(peer, self.core)}): "
                                        f"{message}")
        self._fail(peer.job, f"rank {peer.rank} (lane {peer.lane}) sent a bad frame: {message}", peer.rank)

    def data_path_failed(self, conn, error: Exception) -> None:
        """The RDMA work a frame of `conn` asked for could not be done: its job fails."""
        peer = self.peers.get(conn)
        if peer is not None and peer.job is not None:
            self._fail(peer.job, f"RDMA data path: {error}")

    # -- frames ----------------------------------------------------------------------------
    def payload_target(self, conn, header: wire.Header) -> memoryview:
        peer = self.peers[conn]
        job = peer.job
        # The hot path: a push from the connection's own worker (what check_sender checks, as
        # the rank was checked against the job at HELLO); anything else takes the full checks.
        if header.kind is _PUSH and job is not None and header.sender == peer.rank \
                and header.job == job.spec.job_id and peer.rack < 0 and not peer.said_bye:
            return job.state.push_target(peer.local, header, peer.lane)
        if job is None:
            raise ProtocolError(f"{header.kind.name} data frame before HELLO")
        if peer.said_bye:
            raise ProtocolError(f"{header.kind.name} frame after its BYE")
        if peer.rack >= 0:
            wire.check_sender(header, job=job.spec.job_id, sender=peer.rack)
            if header.kind is wire.Kind.PARTIAL:
                return job.state.partial_target(peer.rack, header, peer.interface)
            if header.kind is wire.Kind.TOTAL:
                return job.state.total_target(peer.rack, header, peer.interface)
            if header.kind is wire.Kind.INIT:
                return job.state.peer_init_target(peer.rack, header, peer.interface)
            raise ProtocolError(f"a rack server may not send {header.kind.name} frames")
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rank, num_workers=job.spec.total_workers)
        if header.kind is wire.Kind.PUSH:
            return job.state.push_target(peer.local, header, peer.lane)
        if header.kind is wire.Kind.INIT:
            return job.state.init_target(peer.local, header, peer.lane)
        if header.kind is wire.Kind.STATE:
            return job.state.state_target(peer.local, header, peer.lane)
        raise ProtocolError(f"a worker may not send {header.kind.name} frames")

    def frame_received(self, conn, frame: wire.Frame) -> None:
        peer = self.peers[conn]
        header = frame.header
        kind = header.kind
        job = peer.job
        if kind is _PUSH:  # the hot path first (a PUSH only lands after payload_target's checks)
            job.last_progress = self.clock()
            events = job.state.on_push(peer.local, header)
            if events:
                self._act(job, events)
            if job.said_bye:  # a worker has left: this round may never complete
                self._check_stranded(job, peer.lane, (job.state.owned[header.chunk],))
            return
        if kind is wire.Kind.HELLO:
            return self._hello(conn, peer, frame.json())
        if peer.pending or job is None:  # a discovery connection may say nothing more
            raise ProtocolError(f"{kind.name} frame before HELLO")
        if peer.said_bye:  # its rounds are over: a late frame would change the others' results
            raise ProtocolError(f"{kind.name} frame after its BYE")
        job.last_progress = self.clock()
        if peer.rack >= 0:
            return self._rack_frame(job, peer, frame)
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rank, num_workers=job.spec.total_workers)
        if kind is wire.Kind.INIT:
            self._act(job, job.state.on_init(header, peer.lane))
        elif kind is wire.Kind.REGISTER:
            self._register(job, peer, frame.json())
        elif kind is wire.Kind.OPTIMIZER:
            if peer.local != 0:
                raise ProtocolError(f"OPTIMIZER frame from rank {peer.rank}: only the first worker sets the optimizer")
            job.state.set_optimizer(peer.lane, messages.optimizer(frame.json()))
            if job.data.pushes_overtake_control:  # the leader's next pushes wait for this echo
                conn.send(wire.control_frame(wire.Kind.OPTIMIZER, job.spec.job_id, _SERVER, {}))
        elif kind is wire.Kind.BYE:
            peer.said_bye = True
            job.said_bye.add((peer.lane, peer.local))
            if self._check_stranded(job, peer.lane, job.state.pending()):
                return
            if len(job.said_bye) == len(job.links) * job.spec.num_workers:
                job.ended = ""
                bye = wire.control_frame(wire.Kind.BYE, job.spec.job_id, self.config.rack, {})
                for rack, interface in self._rack_links():  # on every link: each may close after it
                    self._to_rack(job, rack, interface, bye)
                if self.config.simulated_racks > 1:  # nothing more travels on the core's links to itself
                    for link in [*job.peer_links.values(), *job.loop_ins]:
                        self._drop(link)
                self._carried(job)
                job.release()
        elif kind is wire.Kind.STATE:
            pass  # a checkpointed momentum, already in place (JobState.state_target)
        elif kind is wire.Kind.STATE_REQUEST:
            for state in job.state.lane_states(peer.lane):  # copies: a round may complete before they leave
                mom = state.mom.tobytes() if state.mom is not None else bytes(state.chunk.nbytes)
                conn.send(wire.pack_header(wire.Kind.STATE, job.spec.job_id, _SERVER, state.chunk.id,
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
            self._fail(job, f"rank {peer.rank} gave up: {messages.error_message(frame.json())}", peer.rank)
        else:
            raise ProtocolError(f"a worker may not send {kind.name} frames")

    def fast_pushes(self, conn, staging: memoryview, start: int, end: int):
        """The C loop over a staged link's pushes (see links.StagedLink): a worker's link, or
        the PARTIAL and TOTAL frames of a link to another rack's server."""
        peer = self.peers[conn]
        job = peer.job
        if job is None or job.state is None or job.ended is not None or peer.said_bye:
            return start, True  # the Python path handles (or refuses) what is there
        state = job.state
        if peer.rack >= 0:
            if type(state) is not HierarchicalJobState or peer.pending:
                return start, True
            out, results, completed = {}, {}, []
            offset, at_frame = drain_rack_frames(staging, start, end, job.spec.job_id, self.config.rack, peer.rack,
                                                 state.racks, peer.interface, state.fast_table, state.rack_table,
                                                 state.rack_rows, state.fast_states, state.loop_optimizers, results,
                                                 out, completed)
            if offset != start:
                job.last_progress = self.clock()
                self._rack_rounds_sent(job, peer.interface, results, out, completed)
            return offset, at_frame
        completed: list = []
        # One rack: the C loop optimizes the rounds it completes and builds their RESULT frames
        # (lane -> the frames' parts); with racks to combine, every round goes to `completed`.
        results = {} if state.finishes_rounds_here else None
        offset, at_frame = drain_pushes(staging, start, end, job.spec.job_id, peer.rank, peer.lane, peer.local,
                                        state.num_workers, state.fast_table, state.fast_states, completed,
                                        state.loop_optimizers if results is not None else None, results)
        if offset != start:
            job.last_progress = self.clock()
            # A round's `last` may be a view of `staging`: every completed round is finished here,
            # before the link reads into the buffer again.
            if results is not None:  # no events to sort: optimize and send back
                job.data.send_result_frames(results, job.links)
                finish, send = state.finish_round, self._send_result
                for chunk, acc, last in completed:
                    finish(chunk, acc, last)
                    send(job, chunk)
            elif type(state) is HierarchicalJobState:  # the partials (and an owner's sums) in C too
                out, results, handed_back = {}, {}, []
                rack_rounds_done(completed, job.spec.job_id, self.config.rack, state.racks, state.fast_table,
                                 state.rack_table, state.rack_rows, state.fast_states, state.loop_optimizers,
                                 results, out, handed_back)
                self._rack_rounds_sent(job, state.plan.topology.lane_interface(peer.lane), results, out, handed_back)
            else:
                for chunk, acc, last in completed:
                    self._act(job, state._local_round_done(chunk, acc, last))
            if job.said_bye and job.ended is None:  # a worker has left: these rounds may never complete
                self._check_stranded(job, peer.lane, state.pending())
        return offset, at_frame

    def _rack_rounds_sent(self, job: Job, interface: int, results: dict, out: dict, completed: list) -> None:
        """Send what the C rack loops queued: RESULT frames (lane -> parts), frames to the other
        racks on `interface`'s links (rack -> whole frames), and finish the rounds they handed
        back ((state, total) each: a chunk's first round, or an optimizer they do not run)."""
        if results:
            job.data.send_result_frames(results, job.links)
        for rack, frames in out.items():
            self._to_rack(job, rack, interface, frames)
        for state, total in completed:
            self._send_result(job, job.state.finish_round(state, total, None).state)

    def _share(self, job: Job, name: str, value) -> None:
        """Keep rank 0's value and hand it to every worker on lane 0 (to later ones when they
        connect); it counts against the job's max_job_bytes until the job ends."""
        if name in job.shared:
            raise ProtocolError(f"SHARE: {name!r} was shared already")
        frame = _share_frame(job, name, value)
        left = self.config.max_job_bytes - job.held_bytes
        if len(frame) > left:
            raise ProtocolError(f"SHARE: {name!r} needs {len(frame)} bytes, more than the {left} bytes left of the "
                                f"job's {self.config.max_job_bytes}-byte budget (server option --max-job-bytes)")
        job.shared[name] = frame
        job.shared_bytes += len(frame)
        self._bound_queues(job)
        for conn in job.links.get(0, ()):
            if conn is not None:
                conn.send(frame)

    def _register(self, job: Job, peer: Peer, body: dict) -> None:
        new = body.get("batch") == len(job.state.plan.batches)  # a batch registered before costs nothing again
        budget = self.config.max_job_bytes - job.held_bytes if new else self.config.max_job_bytes
        register = messages.register(body, self.limits, budget)
        try:
            events = job.state.register(peer.local, peer.lane, register.batch, register.arrays)
        except MemoryError:
            raise ProtocolError(f"REGISTER: this server has no memory for batch {register.batch} "
                                f"({register.cost} bytes)") from None
        if new:
            job.registered_bytes += register.cost
            self._bound_queues(job)
        job.data.registered(peer.lane, peer.local, register.batch, body)  # the batch is laid out now
        self._act(job, events)

    def _hello(self, conn, peer: Peer, body: dict) -> None:
        if peer.greeted or not peer.pending:  # also after a discovery: its WELCOME is not sent twice
            raise ProtocolError("HELLO sent twice on one connection")
        peer.greeted = True
        hello = messages.hello(body, self.limits)  # every field typed and bounded before it is used
        job = self.jobs[hello.job]
        if job.ended == "" and self._serves_again:  # the job's last run ended cleanly: this is its next run
            job = self._reopen(job)
        refusal = job.refusal(hello)
        if refusal:
            return self._refuse(conn, refusal)
        if hello.peer_rack is not None:
            return self._rack_hello(conn, peer, job, hello)
        spec = job.spec
        rank, lane = hello.rank, hello.lane
        welcome = {
            "cores": self.config.cores, "interfaces": list(self.config.interfaces),
            "lanes_per_pair": self.config.lanes_per_pair, "chunk_bytes": self.config.chunk_bytes,
            "endpoints": self.endpoints, "first_rank": spec.first_rank, "workers_here": spec.num_workers,
            "transport": self.config.transport,
        }
        if lane == -1:  # discovery only: answer, and let the worker close
            return conn.send(wire.control_frame(wire.Kind.WELCOME, spec.job_id, _SERVER, welcome))
        if job.state is None:
            error = self._create_state(job, hello.shard)
            if error:
                return self._refuse(conn, error)
        refusal = job.lane_refusal(hello, peer.interface)
        if refusal:
            return self._refuse(conn, refusal)
        local = rank - spec.first_rank
        try:
            welcome.update(job.data.hello(peer.interface, lane, local, rank, body))
        except (ProtocolError, JobFailed, ConfigError) as exc:
            return self._refuse(conn, f"rank {rank} lane {lane}: RDMA connection failed: {exc}")
        peer.job, peer.rank, peer.local, peer.lane = job, rank, local, lane
        self._admitted(conn, peer)
        job.links[lane][local] = conn
        job.last_progress = self.clock()
        job.lanes_joined += 1
        if job.first_joined is None:
            job.first_joined = job.last_progress
        if self.config.report_joins and rank not in job.joined:  # the launcher learns who connected
            self.report({"event": "joined", "job": spec.job_id, "rank": rank})
        job.joined.add(rank)
        conn.send(wire.control_frame(wire.Kind.WELCOME, spec.job_id, _SERVER, welcome))
        if lane == 0:  # what rank 0 shared before this worker connected
            for frame in job.shared.values():
                conn.send(frame)

    @property
    def _serves_again(self) -> bool:
        """A server that serves on (not `once`) takes a job's next run once its last one ended
        cleanly; not on a rack server, whose links to the other racks belong to one run."""
        return not self.config.once and not self.config.peers and self.config.simulated_racks == 1

    def _reopen(self, job: Job) -> Job:
        """A fresh state for the next run of a job whose last run ended cleanly (every worker
        said BYE: nothing of that run is read again)."""
        if job.data is not None:
            job.data.close()
        self.jobs[job.spec.job_id] = fresh = Job(job.spec, self.clock())
        self.log(f"job {job.spec.job_id}: a new run starts")
        return fresh

    def _carried(self, job: Job) -> None:
        """Say what the job's run carried through this core, as it ends cleanly: its workers, the
        bytes they pushed and pulled, and its rounds (the most any key went through). The launcher
        gets it as an `ended` event and sums the cores; a server started alone logs it."""
        states = list(job.state.owned.values()) if job.state is not None else []
        rounds = max((state.rounds for state in states), default=0)
        carried = 2 * job.spec.num_workers * sum(state.rounds * state.chunk.nbytes for state in states)
        if self.config.report_joins:
            self.report({"event": "ended", "job": job.spec.job_id, "workers": job.spec.num_workers,
                         "bytes": carried, "rounds": rounds})
        else:
            self.log(f"job {job.spec.job_id} ended cleanly: {job.spec.num_workers} worker(s) pushed and pulled "
                     f"{carried} bytes through this core in {rounds} round(s)")

    def _admitted(self, conn, peer: Peer) -> None:
        """The peer's HELLO was accepted: it may now send frames of every size, and have as
        much wait for it as the job's connections may (Job.queue_bound)."""
        conn.limit_control(wire.MAX_CONTROL_BYTES)
        conn.limit_queue(peer.job.queue_bound())
        self.strangers.left(peer)

    def _bound_queues(self, job: Job) -> None:
        """What the job holds changed: so does what may wait on each of its connections."""
        bound = job.queue_bound()
        for conn in job.live_links():
            conn.limit_queue(bound)

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
        elif self.config.simulated_racks > 1:
            job.state = SimulatedRacksJobState(*args, total_workers=job.spec.total_workers,
                                               racks=self.config.simulated_racks)
        else:
            job.state = JobState(*args, server=shard[0], total_workers=job.spec.total_workers)
        job.data = server_path(self.config.transport, job.spec.job_id, job.state,
                               dict(enumerate(self.config.rdma_devices)))
        job.shard = shard
        job.links = {lane: [None] * job.spec.num_workers for lane in sorted(job.state.lanes)}
        links = self._rack_links()
        if self.config.simulated_racks > 1:  # the core's link to itself on each interface
            links = [(self.config.rack, interface) for interface in range(len(self.config.interfaces))]
        for rack, interface in links:
            if rack < self.config.rack:
                continue  # lower racks call us
            try:
                job.peer_links[(rack, interface)] = self._connect_rack(job, rack, interface)
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
                for local, conn in enumerate(job.links[event.lane]):  # each worker learns where its slots are
                    ready = {"batch": event.batch, **job.data.ready(event.lane, local, event.batch)}
                    conn.send(wire.control_frame(wire.Kind.READY, job.spec.job_id, _SERVER, ready))
            elif isinstance(event, SendPartial):  # to the chunk's owner only, on the chunk's interface
                chunk = event.state.chunk
                header = wire.pack_header(wire.Kind.PARTIAL, job.spec.job_id, self.config.rack, chunk.id,
                                          event.iteration, chunk.nbytes)
                self._to_rack(job, event.owner, job.state.interface_of(chunk.id), header, event.view)
            elif isinstance(event, SendTotal):  # the owner: to every other rack, on the chunk's interface
                chunk = event.state.chunk
                header = wire.pack_header(wire.Kind.TOTAL, job.spec.job_id, self.config.rack, chunk.id,
                                          event.iteration, chunk.nbytes)
                self._to_racks(job, header, event.view, interface=job.state.interface_of(chunk.id))
            elif isinstance(event, SendPeerInit):  # to a rack that sent PEER_READY: it can place them
                for state in event.chunks:
                    self._to_rack(job, event.rack, job.state.interface_of(state.chunk.id),
                                  wire.pack_header(wire.Kind.INIT, job.spec.job_id, self.config.rack,
                                                   state.chunk.id, 0, state.chunk.nbytes), state.weight_view)
            elif isinstance(event, SendPeerReady):
                self._to_racks(job, wire.control_frame(wire.Kind.PEER_READY, job.spec.job_id, self.config.rack,
                                                       {"batch": event.batch}))

    def _send_result(self, job: Job, state: ChunkState) -> None:
        job.data.send_result(state, job.links[state.chunk.lane])

    # -- other racks (two-phase reduction: core c / interface i of every rack talks to core c /
    # interface i of the others, over one link each; control frames go on interface 0's) ------------
    def _rack_frame(self, job: Job, peer: Peer, frame: wire.Frame) -> None:
        header = frame.header
        if header.kind is wire.Kind.ERROR:  # whoever it claims to be from: the job is over
            return self._fail(job, f"rack {peer.rack} failed: {messages.error_message(frame.json())}")
        wire.check_sender(header, job=job.spec.job_id, sender=peer.rack)
        if header.kind is wire.Kind.PARTIAL:
            self._act(job, job.state.on_partial(peer.rack, header))
        elif header.kind is wire.Kind.TOTAL:
            self._act(job, job.state.on_total(peer.rack, header))
        elif header.kind is wire.Kind.INIT:
            self._act(job, job.state.on_peer_init(header))
        elif header.kind is wire.Kind.PEER_READY:
            self._act(job, job.state.on_peer_ready(peer.rack, messages.peer_ready(frame.json())))
        elif header.kind is wire.Kind.SHARE and peer.rack == 0:  # rank 0's value, for this rack's workers
            self._share(job, *messages.share(frame.json()))
        elif header.kind is wire.Kind.BYE:
            job.racks_done.add((peer.rack, peer.interface))
        else:
            raise ProtocolError(f"a rack server may not send {header.kind.name} frames")

    def _rack_links(self):
        """(rack, interface) of every link this core has to the other racks' servers."""
        return [(rack, interface) for rack in range(self.config.racks) if rack != self.config.rack
                for interface in range(len(self.config.interfaces))]

    def _connect_rack(self, job: Job, rack: int, interface: int):
        """Open this core's link on `interface` to core `self.core` / the same interface of rack
        `rack` (lower racks call higher ones): from this server's address on that interface, so the
        link's bytes leave and enter through that interface's NIC."""
        if rack == self.config.rack:  # simulated racks: this core's own listener on that interface
            address = tuple(self.endpoints[self.core][interface])
        else:
            hosts, port = check_peer(self.config.peers[rack])
            address = (hosts[interface], port + self.core)  # every rack server uses the same port layout
        source = self.config.interfaces[interface]
        try:
            conn = self.open_connection(address, source)
        except ConfigError as exc:
            raise ConfigError(f"cannot reach rack {rack}'s server at {address[0]}:{address[1]} (interface "
                              f"{interface}, from {source}): {exc}") from None
        hello = {"job": job.spec.job_id, "token": job.spec.token, "peer_rack": self.config.rack, "core": self.core,
                 "interface": interface}
        conn.send(wire.control_frame(wire.Kind.HELLO, job.spec.job_id, self.config.rack, hello))
        peer = self.peers[conn] = Peer(interface, address[0], since=self.clock())
        peer.job, peer.rack = job, rack
        conn.limit_queue(job.queue_bound())
        return conn

    def _rack_hello(self, conn, peer: Peer, job: Job, hello: messages.Hello) -> None:
        rack, interface = hello.peer_rack, hello.interface  # typed and bounded by messages.hello
        if self.config.simulated_racks > 1:
            return self._loop_hello(conn, peer, job, hello)
        if not self.config.peers or not 0 <= rack < self.config.rack:
            return self._refuse(conn, f"unexpected rack server hello from rack {rack!r}")
        if hello.core != self.core:
            return self._refuse(conn, f"rack {rack} connected its core {hello.core} to core {self.core}: "
                                      "each core links to the same core of the other racks")
        if interface != peer.interface:
            return self._refuse(conn, f"rack {rack} says its link is interface {interface}'s, but it arrived on "
                                      f"interface {peer.interface} ({self.config.interfaces[peer.interface]})")
        expected = check_peer(self.config.peers[rack])[0][interface]
        if peer.address != expected:  # from another interface's address, it would load that NIC
            return self._refuse(conn, f"rack {rack}'s link for interface {interface} comes from {peer.address}, "
                                      f"not from that interface's address {expected}")
        if (rack, interface) in job.peer_links:
            return self._refuse(conn, f"rack {rack} connected core {self.core} / interface {interface} twice")
        if job.state is None:
            error = self._create_state(job, (0, 1))
            if error:
                return self._refuse(conn, error)
        peer.job, peer.rack = job, rack
        self._admitted(conn, peer)
        job.peer_links[(rack, interface)] = conn
        for parts in job.rack_backlog.pop((rack, interface), ()):
            conn.send(*parts)

    def _loop_hello(self, conn, peer: Peer, job: Job, hello: messages.Hello) -> None:
        """Simulated racks: the other end of this core's link to itself on an interface."""
        own = self.config.interfaces[peer.interface]
        if (hello.peer_rack, hello.core, hello.interface) != (self.config.rack, self.core, peer.interface) or \
                peer.address != own or job.state is None:
            return self._refuse(conn, f"a simulated rack's link must come from core {self.core} itself, on the "
                                      f"interface it names (from {own}); this one says core {hello.core}, "
                                      f"interface {hello.interface}, from {peer.address}")
        peer.job, peer.rack = job, self.config.rack
        self._admitted(conn, peer)
        job.loop_ins.append(conn)

    def _to_rack(self, job: Job, rack: int, interface: int, *parts) -> None:
        """Send on the link to `rack` on `interface`; if that (lower) rack has not connected it yet,
        it gets the parts when it does (nothing it is sent can change before then: a chunk's
        buffers are rewritten only once the other racks have what was sent of it, reduction/hierarchy.py)."""
        conn = job.peer_links.get((rack, interface))
        if conn is not None:
            conn.send(*parts)
        else:
            job.rack_backlog.setdefault((rack, interface), []).append(parts)

    def _to_racks(self, job: Job, *parts, interface: int = 0) -> None:
        """Send to every other rack, on `interface`'s link (control frames: interface 0's)."""
        for rack in range(self.config.racks):
            if rack != self.config.rack:
                self._to_rack(job, rack, interface, *parts)

    # -- failures and time ------------------------------------------------------------------
    def _refuse(self, conn, message: str) -> None:
        """Tell a peer that has not joined a job why it is turned away, and drop it."""
        self.refusals.refused(message)
        self._drop(conn, wire.control_frame(wire.Kind.ERROR, 0, _SERVER, {"message": message}))

    def _drop(self, conn, last: Optional[bytes] = None, discard_queued: bool = False) -> None:
        peer = self.peers.pop(conn, None)
        if peer is not None:
            self.strangers.left(peer)
        conn.finish(last, discard_queued)

    def _check_stranded(self, job: Job, lane: int, states) -> bool:
        """Fail the job if a round of `lane` waits for a worker that said BYE (Job.stranded)."""
        stranded = job.stranded(lane, states)
        if stranded:
            self._fail(job, *stranded)
        return bool(stranded)

    def _fail(self, job: Job, message: str, rank: Optional[int] = None) -> None:
        """End `job` with `message`, sent to every connection of it; `rank`: the worker that
        caused it, when one did (the launcher names it as the root cause)."""
        if job.ended is not None:
            return
        job.ended = message
        self.log(f"job {job.spec.job_id} failed: {message}")
        if self.config.report_joins:  # first, before what it causes: the other cores may blame its victims
            self.report({"event": "failed", "job": job.spec.job_id, "rank": rank, "message": message})
        frame = wire.control_frame(wire.Kind.ERROR, job.spec.job_id, _SERVER,
                                   {"message": f"job {job.spec.job_id} failed: {message}"})
        for conn in list(job.live_links()):
            self._drop(conn, frame, discard_queued=True)  # a result cut mid-way is worthless
        job.release()  # nothing reads its arrays again (unless an RDMA path's completions may)

    def poll_data_paths(self) -> None:
        """Take the pushes that landed outside the connections (RDMA writes)."""
        for job in self.jobs.values():
            if job.data is None or job.data.nap is None or job.ended is not None:
                continue
            try:
                for local, lane, header in job.data.poll():
                    if job.said_bye and (lane, local) in job.said_bye:
                        raise ProtocolError(f"rank {job.spec.first_rank + local} pushed chunk {header.chunk} "
                                            f"on lane {lane} after its BYE")
                    job.last_progress = self.clock()
                    events = job.state.on_push(local, header)
                    if events:
                        self._act(job, events)
                    if job.said_bye and self._check_stranded(job, lane, (job.state.owned[header.chunk],)):
                        break
            except (ProtocolError, JobFailed) as exc:
                self._fail(job, f"RDMA data path: {exc}")

    def tick(self) -> None:
        """Check the clocks: stalled jobs, strangers past their deadline (once a second), refusal counts."""
        now = self.clock()
        self._check_stalls(now)
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        if self.strangers.pending:
            deadline = min(HANDSHAKE_SECONDS, self.config.timeout)
            for conn, peer in list(self.peers.items()):
                if peer.pending and now - peer.since > deadline:
                    self.refusals.refused(f"no HELLO accepted within {deadline:g} s")
                    self._drop(conn)
        line = self.refusals.summary(now)
        if line:
            self.log(line)

    def _check_stalls(self, now: float) -> None:
        for job in self.jobs.values():
            failure, report = job.stall(now, self.config.timeout, self.config.once, self.config.connect_wait)
            if failure:
                self._fail(job, failure)
            elif report:
                self.log(report)


def _rack_link(peer: Peer, core: int) -> str:
    """A link to another rack's server, in words: which core and interface, and the peer's address."""
    return f"the link of core {core} / interface {peer.interface}, {peer.address or 'address unknown'}"


def _share_frame(job: Job, name: str, value) -> bytes:
    return wire.control_frame(wire.Kind.SHARE, job.spec.job_id, _SERVER, {"name": name, "value": value})
