"""What one server core knows about each job and each connection (no I/O; see core.py).

A connection here is whatever object the core's loop hands the protocol for it: a
`links.Link` in a server, a `phub.protocol.testing.MemoryConnection` in a test.
"""
from __future__ import annotations

import re
import time
from typing import Callable, Dict, List, Optional, Tuple

from . import wire
from ..reduction.aggregation import ChunkState, JobState
from ..config import JobSpec
from ..reduction.hierarchy import HierarchicalJobState, SimulatedRacksJobState

Connection = object  # send(*parts), finish(last, discard_queued), close(), closed, limit_control(n), limit_queue(n)

# What may wait to be sent on one of a job's connections, beyond twice what the job holds (one
# round's results of every chunk, and a copy of their optimizer state for a STATE_REQUEST): room
# for the control frames (two of the largest).
QUEUE_SLACK = 2 * wire.MAX_CONTROL_BYTES


class Job:
    """A job as one core sees it: the aggregation state plus its connections.

    The state is created by the job's first lane HELLO, which says how many shards the workers
    spread the job over and which one this server is (every later HELLO must agree), or, on a
    rack server, by whichever comes first: a worker or another rack.
    """

    def __init__(self, spec: JobSpec, now: float):
        self.spec = spec
        self.state: Optional[JobState] = None
        self.data = None  # how its chunks move (tcp.TcpServerPath, or an RDMA one), with the state
        self.shard: Tuple[int, int] = (0, 1)  # (this server's index, number of shards)
        self.links: Dict[int, List[Optional[Connection]]] = {}  # lane -> connection per local worker
        # (rack, interface) -> the link to that rack's server, same core, same interface
        self.peer_links: Dict[Tuple[int, int], Connection] = {}
        self.rack_backlog: Dict[Tuple[int, int], list] = {}  # (rack, interface) -> frames for when it connects
        self.said_bye: set = set()  # (lane, local rank) of workers that closed cleanly
        self.racks_done: set = set()  # (rack, interface) of links whose rack said it has finished the job
        self.loop_ins: list = []  # simulated racks: the accepted ends of the core's links to itself
        self.ended: Optional[str] = None  # None while running; "" = finished cleanly; else the error
        self.last_progress = now
        self.stall_reported = False
        self.registered_bytes = 0  # counted against the server's max_job_bytes (messages.register)
        self.joined: set = set()  # ranks with a lane admitted on this core
        self.lanes_joined = 0  # (lane, worker) connections admitted, of len(links) x num_workers
        self.first_joined: Optional[float] = None  # when the first was
        self.shared: Dict[str, bytes] = {}  # what rank 0 shared (wire.Kind.SHARE), by name: the frame to send
        self.shared_bytes = 0  # their frames' bytes, also counted against max_job_bytes

    @property
    def held_bytes(self) -> int:
        """What the job holds on this core against the server's max_job_bytes: its registered
        arrays and the values rank 0 shared."""
        return self.registered_bytes + self.shared_bytes

    def queue_bound(self) -> int:
        """How many bytes may wait to be sent on one of the job's connections (Link.limit_queue)."""
        return 2 * self.held_bytes + QUEUE_SLACK

    def release(self) -> None:
        """The job has ended: let go of what it holds. Its arrays (unless its data path still
        needs them), shared values, frames for racks and its worker connections: the core has
        closed those, or keeps the ones still open until their peers close them."""
        if self.data is None or not self.data.keeps_arrays_after_failure:
            self.state = None
        self.shared.clear()
        self.rack_backlog.clear()
        self.links = {}

    # -- admission: what a HELLO may ask (no I/O: the core sends the refusal) ------------------
    def refusal(self, hello) -> Optional[str]:
        """Why a HELLO (`messages.Hello`, already typed and bounded) is turned away before anything
        is set up for it, or None: a wrong token, a job that has ended, and for a worker a rank
        this server does not serve or another count of workers than the job's."""
        spec = self.spec
        if hello.token != spec.token:
            return f"wrong token for job {spec.job_id}"
        if self.ended is not None:
            return f"job {spec.job_id} has already ended"
        if hello.peer_rack is not None:
            return None
        last = spec.first_rank + spec.num_workers - 1
        if not spec.first_rank <= hello.rank <= last:
            return f"rank {hello.rank!r} is not one of this server's ranks of job {spec.job_id} ({spec.first_rank}..{last})"
        if hello.num_workers != spec.total_workers:
            return f"rank {hello.rank} expects {hello.num_workers} workers, job {spec.job_id} has {spec.total_workers}"
        return None

    def lane_refusal(self, hello, interface: int) -> Optional[str]:
        """Why a worker's lane HELLO on `interface` is turned away once the job is set up on this
        core, or None: another shard layout than the other workers', a lane this core does not
        serve on that interface, a lane the worker connected already."""
        if hello.shard != self.shard:
            return (f"rank {hello.rank} says this server is shard {hello.shard[0]} of {hello.shard[1]}, "
                    f"other workers said {self.shard[0]} of {self.shard[1]}")
        if hello.lane not in self.links or self.state.plan.topology.lane_interface(hello.lane) != interface:
            return f"lane {hello.lane!r} is not served on this core/interface"
        if self.links[hello.lane][hello.rank - self.spec.first_rank] is not None:
            return f"rank {hello.rank} connected lane {hello.lane} twice"
        return None

    def live_links(self):
        for lane_links in self.links.values():
            yield from (link for link in lane_links if link is not None and not link.closed)
        yield from (link for link in self.peer_links.values() if not link.closed)
        yield from (link for link in self.loop_ins if not link.closed)

    def stranded(self, lane: int, states) -> Optional[Tuple[str, int]]:
        """Why a round of `lane` can never complete, and the rank that left, or None: a worker
        that said BYE on the lane (so all its rounds there were complete) is missing from one of
        `states` that is part-way through a round: the others pushed past the end of its work."""
        gone = [local for bye_lane, local in self.said_bye if bye_lane == lane]
        first = self.spec.first_rank
        for state in states:
            if not state.arrived or state.chunk.lane != lane:
                continue
            for local in gone:
                if not state.mask >> local & 1:
                    pushed = [first + r for r in range(self.spec.num_workers) if state.mask >> r & 1]
                    return (f"worker {first + local} left the job (it closed or exited) while rank(s) {pushed} "
                            f"still push chunk {state.chunk.id} (iteration {state.rounds + 1}): that round can "
                            f"never complete; every worker must make the same pushpull calls", first + local)
        return None

    def stall(self, now: float, timeout: float, once: bool,
              connect_wait: Optional[float] = None) -> Tuple[Optional[str], Optional[str]]:
        """What the job's idleness calls for at `now`: (why it fails, what to log), each or both
        None. A job nobody connected to fails after `timeout` (only with `once`: a server that
        serves on waits for them); one whose workers have not all connected `connect_wait`
        seconds (default `timeout`) after the first did fails naming the missing ranks; a job
        that waits for a push or a connection is reported once after min(30 s, timeout / 2) and
        fails after `timeout`, naming what it waits for."""
        if self.ended is None and self.state is None and once and now - self.last_progress >= timeout:
            first = self.spec.first_rank
            return (f"no worker connected within {timeout:g} s: rank(s) "
                    f"{list(range(first, first + self.spec.num_workers))} never did"), None
        if self.ended is not None or self.state is None:
            return None, None
        connect_wait = timeout if connect_wait is None else connect_wait
        if self.lanes_joined < len(self.links) * self.spec.num_workers and self.first_joined is not None \
                and now - self.first_joined >= connect_wait:
            return (f"rank(s) {self.unconnected()} never connected within {connect_wait:g} s of the job's first "
                    "worker (--connect-timeout); the others waited for them"), None
        if not any(self.live_links()):
            return None, None
        idle = now - self.last_progress
        if idle < min(30.0, timeout / 2):  # checked first: pending() visits every chunk
            self.stall_reported = False
            return None, None
        pending = self.state.pending()
        if not pending and all(conn is not None for conns in self.links.values() for conn in conns):
            self.stall_reported = False
            return None, None
        missing = self.missing(pending)
        if idle >= timeout:
            return f"stalled for {idle:.0f} s waiting for {missing}", None
        if self.stall_reported:
            return None, None
        self.stall_reported = True
        return None, f"job {self.spec.job_id} has waited {idle:.0f} s for {missing}"

    def unconnected(self) -> List[int]:
        """The ranks with a lane on this core that has not connected yet."""
        first = self.spec.first_rank
        return sorted({first + local for links in self.links.values() for local, link in enumerate(links)
                       if link is None})

    def missing(self, pending: List[ChunkState]) -> str:
        """What a stalled job waits for, in words (its pending chunks, or ranks to connect)."""
        first = self.spec.first_rank
        unconnected = self.unconnected()
        if unconnected:
            return f"rank(s) {unconnected} to connect"
        ranks = sorted({first + r for s in pending for r in s.missing(self.spec.num_workers)})
        chunks = sorted(s.chunk.id for s in pending)
        shown = ", ".join(map(str, chunks[:8])) + (" ..." if len(chunks) > 8 else "")
        if not ranks and isinstance(self.state, (HierarchicalJobState, SimulatedRacksJobState)):
            racks = sorted({r for s in pending for r in self.state.missing_racks(s)})
            return f"rack(s) {racks} to send chunk(s) {shown}"
        return f"rank(s) {ranks} to push chunk(s) {shown}"


class Peer:
    """What a server-side connection has proven about itself (nothing until its HELLO)."""

    __slots__ = ("interface", "job", "rank", "local", "lane", "rack", "address", "since", "pending", "greeted",
                 "said_bye")

    def __init__(self, interface: int, address: str = "", since: float = 0.0):
        self.interface = interface
        self.address = address  # the remote IP address
        self.since = since  # when the connection was accepted
        self.pending = False  # counted among its address's connections that have not authenticated
        self.greeted = False  # it sent a HELLO (one per connection)
        self.job: Optional[Job] = None
        self.rank = -1  # the worker's rank in the job (-1: another rack's server)
        self.local = -1  # its index among this server's workers
        self.lane = -1
        self.rack = -1  # another rack's index, on a link between rack servers
        self.said_bye = False  # the worker said BYE on this connection: it may send nothing more


class RefusalLog:
    """Refused connections, logged once per cause and then counted: a flood of bad peers costs a
    few lines a minute, not one per connection. `summary()` returns what was counted since the
    last summary (or None), at most once per `every` seconds."""

    MAX_CAUSES = 100  # distinct causes remembered; later ones are counted as "other"

    def __init__(self, log: Callable[[str], None], every: float = 10.0, now: Optional[float] = None):
        self._log = log
        self._every = every
        self._seen: set = set()
        self._counts: Dict[str, int] = {}
        self._last = time.monotonic() if now is None else now

    def refused(self, message: str) -> None:
        cause = re.sub(r"\d+", "N", message)[:120]
        if cause not in self._seen and len(self._seen) >= self.MAX_CAUSES:
            cause = "other"
        if cause not in self._seen:
            self._seen.add(cause)
            self._log(f"refused a connection: {message} (more of this kind are counted, not logged)")
            return
        self._counts[cause] = self._counts.get(cause, 0) + 1

    def summary(self, now: float) -> Optional[str]:
        if not self._counts or now - self._last < self._every:
            return None
        counts = sorted(self._counts.items(), key=lambda item: -item[1])
        total = sum(n for _, n in counts)
        shown = "; ".join(f"{n} x {cause}" for cause, n in counts[:5]) + (" ..." if len(counts) > 5 else "")
        line = f"refused {total} more connection(s) in the last {now - self._last:.0f} s: {shown}"
        self._counts.clear()
        self._last = now
        return line
