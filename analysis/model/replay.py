"""A discrete-event replay of one training iteration (SimPy), pure: no I/O.

What is modelled, and the one term each part stands for:

* **Compute**: the worker's emulated GPU, as `experiments.replay` runs it: forward layer by layer
  (each layer first waits for its new weights), then backward in reverse layer order, each
  layer's gradient handed to the system as soon as that layer's backward is done. Compute runs on
  a deadline clock, so CPU work on the worker's main thread overlaps it (as in the real replay).
* **Links**: every node's link, one `Link` per direction at its rate (payload bytes per second:
  the emulated rack's measured goodput), shared by the connections that cross it in round robin
  (the rack's fair queueing), each connection first in, first out (a TCP byte stream). A message
  goes through the links of its path piece by piece (pieces of about `piece_seconds` at the
  link's rate), so consecutive hops pipeline. A node's link to itself (a shard on its own worker)
  is no link at all.
* **CPU**: each role's work costs `per_message` x messages + `per_byte` x payload bytes (the
  fitted `Costs`, divided by `cpu_speed`) on one of its process's threads (`actor`, a SimPy
  Resource: a server's cores, a worker's I/O thread, its framework thread) *and* one core of its
  node (a Resource per node, or one pool shared by every node when modelling this machine).
* **Systems**: which messages exist, where they go, and when a server may answer
  (`experiments.systems`): phub (one PBox: K interfaces bundled into one link of K times the
  rate, C cores; every chunk's copies meet on the server, then go back), pshard (phub's
  software, one shard on every worker node, chunks spread over shards by phub's plan),
  pslite-central / pslite-shard (MXNet's dist_sync: per key and server a push, an acknowledgement
  once every worker's push is aggregated and updated, then a pull request and the weights; arrays
  of at least the big-array bound split evenly over the servers, the others whole to server
  key * 9973 mod S), gloo-ring (after backward, a ring allreduce of the whole gradient, then NAG on
  every worker).
* **The rack simulation** (`Job.simulated_racks` R > 1, phub only, as `phub server
  --simulate-racks` and the paper's chart ran it): once a unit's copies are all in, its server
  sends the aggregate to itself and adds it again, R trips one after the other, before answering;
  each trip is a send and a receive of the unit on the server's threads, and crosses the PBox's
  link out and back where the machine says its trips do (`Machine.trips_on_link`: the paper's
  went through its NICs; the emulated PBox's through its own loopback, CPU only).

To keep events few, consecutive layers are released together in at most `groups` groups (by
bytes and by backward time), and one group's messages to one server travel as one unit that
counts all their messages. The iteration timed is the second one, from the end of the first
backward to the end of the second, as `experiments.replay` times its iterations.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import simpy

from experiments.softcost import gloo_segments

from .traffic import Unit, exchange_counts, group_layers, key_parts, units_of  # noqa: F401 (also from here)

PHUB_HEADER_BYTES = 32  # phub.protocol.wire's frame header, on every chunk
PSLITE_HEADER_BYTES = 96  # ps-lite's message meta + ZeroMQ frames (keys, lengths), about; an assumption
GLOO_HEADER_BYTES = 0
SYSTEMS = ("phub", "pshard", "pslite-central", "pslite-shard", "gloo-ring")
# Events are what the replay costs: 12 layer groups and at most 16 pieces per message and hop
# move the committed grid's predictions by a median 0.5% (at most 5%) from 24 groups and 64
# pieces, in half the time; phub's units are finer than a group (traffic.UNIT_SPLIT).
DEFAULT_GROUPS = 12
MAX_PIECES = 16


@dataclass(frozen=True)
class Costs:
    """CPU seconds (on this machine) of one role: per message sent or received, per payload byte.
    `busiest_share`: the part of it a process's busiest thread of the role does, which holds the
    role's thread; the rest runs after it on the process's other threads (ZeroMQ's I/O thread,
    MXNet's engine), a core each but not the role's thread, so consecutive messages overlap it."""
    per_message: float = 0.0
    per_byte: float = 0.0
    busiest_share: float = 1.0

    def seconds(self, messages: float, nbytes: float) -> float:
        return self.per_message * messages + self.per_byte * nbytes


@dataclass(frozen=True)
class RoleCosts:
    """A system's fitted costs by role (`analysis.model.fit`)."""
    server: Costs = Costs()
    worker_io: Costs = Costs()
    worker_framework: Costs = Costs()


@dataclass(frozen=True)
class Machine:
    """The hardware: link rate (bytes/s per direction, None = no limit), cores, CPU speed.

    `shared_cores`: every node shares this many cores (this machine, where the emulated rack's
    nodes are namespaces of one VM); None: each node has its own (`worker_node_cores`,
    `server_node_cores`). `cpu_speed`: that machine's CPU over this one's (costs are divided by it).
    """
    link_bytes_per_s: Optional[float]
    shared_cores: Optional[int] = None
    server_link_bytes_per_s: Optional[float] = None  # a server interface's rate; None: the same; inf: no limit
    worker_node_cores: int = 1
    server_node_cores: int = 1
    cpu_speed: float = 1.0
    # Per role, (role, its measured CPU plus run-queue wait over its CPU): the role's work takes
    # that much longer on its thread, and no core is simulated, since the measured wait already
    # holds every wait for a core (the job's own threads' and the machine's other work's).
    # Empty: the cores are simulated (shared_cores or each node's own).
    stretch: Tuple[Tuple[str, float], ...] = ()
    # Whether a PBox's rack-simulation trips to itself cross its link (its NICs) or not (loopback).
    trips_on_link: bool = False
    uplink_bytes_per_s: Optional[float] = None  # a rack's link to the core (Job.racks > 1); None: no limit


@dataclass(frozen=True)
class Job:
    """One job: the system, the model's layers (forward order), the counts and knobs.

    `layers`: per layer (array elements, forward seconds, backward seconds).
    `server_cores`: phub's cores per PBox or per shard (each a server thread).
    """
    system: str
    layers: Tuple[Tuple[Tuple[int, ...], float, float], ...]
    workers: int
    interfaces: int = 1
    server_cores: int = 1
    chunk_bytes: int = 32768
    bigarray_bound: int = 1000 * 1000
    groups: int = DEFAULT_GROUPS
    piece_seconds: float = 1e-3
    simulated_racks: int = 1  # phub standing in for this many racks (1: a plain PBox)
    racks: int = 1  # phub's racks on the wire, a PBox each, `workers` spread evenly (multirack.py)

    def __post_init__(self):
        if self.system not in SYSTEMS:
            raise ValueError(f"system {self.system!r}: the model knows {', '.join(SYSTEMS)}")
        if self.workers < 1 or not self.layers:
            raise ValueError(f"a job needs at least one worker and one layer (workers={self.workers})")
        if self.simulated_racks < 1 or (self.simulated_racks > 1 and self.system != "phub"):
            raise ValueError(f"simulated_racks={self.simulated_racks}: at least 1, and above 1 only for phub")
        if self.racks < 1 or (self.racks > 1 and (self.system != "phub" or self.workers % self.racks)):
            raise ValueError(f"racks={self.racks}: at least 1, and above 1 only for phub with the same workers "
                             f"in every rack (workers={self.workers})")


class Link:
    """One direction of a link: pieces served at `rate` bytes/s, round robin over flows."""

    def __init__(self, env: simpy.Environment, rate: float):
        self.env, self.rate = env, rate
        self.queues: Dict[object, deque] = {}
        self.active: deque = deque()
        self.wake: Optional[simpy.Event] = None
        self.busy = 0.0
        env.process(self._serve())

    def enqueue(self, flow, nbytes: float) -> simpy.Event:
        done = self.env.event()
        if flow not in self.queues:
            self.queues[flow] = deque()
            self.active.append(flow)
        self.queues[flow].append((nbytes, done))
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()
        return done

    def _serve(self):
        while True:
            if not self.active:
                self.wake = self.env.event()
                yield self.wake
                continue
            flow = self.active.popleft()
            queue = self.queues[flow]
            nbytes, done = queue.popleft()
            if queue:
                self.active.append(flow)
            else:
                del self.queues[flow]
            yield self.env.timeout(nbytes / self.rate)
            self.busy += nbytes / self.rate
            done.succeed()


class Node:
    """A machine of the job: its link (up = leaving it, down = arriving), its cores (None: more
    cores than threads, so none ever waits for one)."""

    def __init__(self, env, rate: Optional[float], cores: simpy.Resource, name: str):
        self.name = name
        self.up = Link(env, rate) if rate else None
        self.down = Link(env, rate) if rate else None
        self.cores = cores


class Iteration:
    """The replay itself: build with a job, machine and costs, then `run()` -> seconds."""

    def __init__(self, job: Job, machine: Machine, costs: RoleCosts):
        self.job, self.machine, self.costs = job, machine, costs
        self.env = env = simpy.Environment()
        self.groups = group_layers(job)
        n, system = job.workers, job.system
        shared = simpy.Resource(env, machine.shared_cores) if machine.shared_cores and not machine.stretch else None

        def cores(count):
            return shared or simpy.Resource(env, count)

        rate = machine.link_bytes_per_s
        server_rate = rate if machine.server_link_bytes_per_s is None else machine.server_link_bytes_per_s
        server_rate = None if server_rate == math.inf else server_rate
        self.workers = [Node(env, rate, cores(machine.worker_node_cores), f"w{w}") for w in range(n)]
        if system in ("pshard", "pslite-shard"):
            self.servers = self.workers  # a shard on every worker node
        elif system == "phub":  # the PBox: K interfaces as one link of K times the rate
            self.servers = [Node(env, server_rate and server_rate * job.interfaces,
                                 cores(machine.server_node_cores), "pbox")]
        elif system == "pslite-central":  # one server on the PBox node's first interface
            self.servers = [Node(env, server_rate, cores(machine.server_node_cores), "server")]
        else:
            self.servers = []
        per_server = job.server_cores if system in ("phub", "pshard") else 1
        self.server_threads = [simpy.Resource(env, per_server) for _ in self.servers]
        self.io_threads = [simpy.Resource(env, 1) for _ in range(n)]
        self.main_threads = [simpy.Resource(env, 1) for _ in range(n)]
        # A node with at least as many cores as threads that run on it never makes one wait for
        # a core: its cores are left out (the same times, half the events).
        threads: Dict[int, int] = {}
        for node in self.workers:
            threads[id(node)] = threads.get(id(node), 0) + 2  # the I/O thread and the main thread
        for node, pool in zip(self.servers, self.server_threads):
            threads[id(node)] = threads.get(id(node), 0) + pool.capacity
        for node in {id(node): node for node in self.workers + self.servers}.values():
            if machine.stretch or (node.cores is not shared and node.cores.capacity >= threads[id(node)]):
                node.cores = None
        stretch = dict(machine.stretch)
        self.stretch = {id(t): stretch.get("server", 1.0) for t in self.server_threads}
        self.stretch.update({id(t): stretch.get("worker_io", 1.0) for t in self.io_threads})
        self.stretch.update({id(t): stretch.get("worker_framework", 1.0) for t in self.main_threads})
        self.share = {id(t): costs.server.busiest_share for t in self.server_threads}
        self.share.update({id(t): costs.worker_io.busiest_share for t in self.io_threads})
        self.share.update({id(t): costs.worker_framework.busiest_share for t in self.main_threads})
        self.units = units_of(job, len(self.servers), self.groups)
        # Messages per key part and worker, sent plus received, as the software-cost rows count
        # them (each role of a worker, and the server per worker): phub a push and its result;
        # ps-lite a push, its acknowledgement, a pull request and its answer.
        self.messages_per_part = 4 if system.startswith("pslite") else 2

    # -- the pieces -----------------------------------------------------------------------------
    def cpu(self, thread: simpy.Resource, node: Node, seconds: float):
        """A process: `seconds` of CPU on one core of `node`, times the thread's role's measured
        stretch (`Machine.stretch`) where there is one; the role's busiest-thread share of it
        (`Costs.busiest_share`) also holds `thread` (FIFO for both), the rest follows on a core only."""
        if seconds <= 0:
            return
        seconds = seconds * self.stretch.get(id(thread), 1.0) / self.machine.cpu_speed
        share = self.share.get(id(thread), 1.0)
        with thread.request() as held:
            yield held
            yield from self._on_core(node, seconds * share)
        if share < 1:
            yield from self._on_core(node, seconds * (1 - share))

    def _on_core(self, node: Node, seconds: float):
        if node.cores is None:
            yield self.env.timeout(seconds)
            return
        with node.cores.request() as core:
            yield core
            yield self.env.timeout(seconds)

    def send(self, src: Node, dst: Node, nbytes: float) -> simpy.Event:
        """An event that fires once `nbytes` have crossed src's uplink and dst's downlink."""
        path = [] if src is dst else [link for link in (src.up, dst.down) if link is not None]
        return self.transfer(path, (src.name, dst.name), nbytes)

    def transfer(self, path, flow, nbytes: float) -> simpy.Event:
        """An event that fires once `nbytes` of `flow` have crossed every link of `path`, in
        pieces that pipeline over the hops (none: at once)."""
        env = self.env
        done = env.event()
        if not path:
            done.succeed()
            return done
        piece = max(1.0, min(link.rate for link in path) * self.job.piece_seconds)
        count = min(MAX_PIECES, max(1, math.ceil(nbytes / piece)))
        remaining = [count]

        def hop(size, index):
            path[index].enqueue(flow, size).callbacks.append(lambda _: arrived(size, index))

        def arrived(size, index):
            if index + 1 < len(path):
                hop(size, index + 1)
                return
            remaining[0] -= 1
            if not remaining[0]:
                done.succeed()

        for _ in range(count):
            hop(nbytes / count, 0)
        return done

    # -- the worker's replay --------------------------------------------------------------------
    def run(self) -> float:
        """Seconds of the second iteration (end of backward 1 to end of backward 2)."""
        ready = [[[self.env.event() for _ in self.groups] for _ in self.workers] for _ in range(2)]
        self.ready = ready
        mains = [self.env.process(self._worker(w)) for w in range(self.job.workers)]
        self.env.run(until=simpy.AllOf(self.env, mains))
        return max(m.value for m in mains)

    def _worker(self, w: int):
        env, job = self.env, self.job
        deadline = env.now
        marks = []
        for iteration in range(2):
            for g, group in enumerate(self.groups):  # forward, in layer order
                if iteration:
                    yield self.ready[iteration - 1][w][g]
                deadline = max(deadline, env.now)
                deadline += group.forward
                yield env.timeout(max(0.0, deadline - env.now))
            for g in reversed(range(len(self.groups))):  # backward, in reverse order
                deadline += self.groups[g].backward
                yield env.timeout(max(0.0, deadline - env.now))
                if job.system != "gloo-ring":
                    yield from self._release(iteration, w, g)
            if job.system == "gloo-ring":
                yield from self._allreduce(iteration, w)
            marks.append(env.now)
        return marks[1] - marks[0]

    def _release(self, iteration: int, w: int, g: int):
        """The framework hands group g's gradient to the system (on the main thread)."""
        units = [u for u in self.units if u.group == g]
        framework, per = self.costs.worker_framework, self.messages_per_part // 2
        yield from self.cpu(self.main_threads[w], self.workers[w],
                            sum(framework.seconds(per * unit.messages, unit.nbytes) for unit in units))
        pending = [self.env.process(self._exchange(iteration, w, unit)) for unit in units]
        self.env.process(self._complete(self.ready[iteration][w][g], pending))

    def _complete(self, event: simpy.Event, pending):
        yield simpy.AllOf(self.env, pending)
        event.succeed()

    # -- the systems ----------------------------------------------------------------------------
    def _exchange(self, iteration: int, w: int, unit: Unit):
        """One worker's unit: push, the server's aggregation and update, the weights back."""
        s = self._server_of(w, unit)
        c, worker, server = self.costs, self.workers[w], self.servers[s]
        io, threads = self.io_threads[w], self.server_threads[s]
        pslite = self.job.system.startswith("pslite")
        header = PSLITE_HEADER_BYTES if pslite else PHUB_HEADER_BYTES
        m, b = unit.messages, unit.nbytes
        yield from self.cpu(io, worker, c.worker_io.seconds(m, b))
        yield self.send(worker, server, b + m * header)
        yield from self.cpu(threads, server, c.server.seconds(m, b))
        yield from self._aggregated(iteration, w, unit)  # every copy in, aggregated and updated
        if pslite:  # the acknowledgement, then the pull request behind this worker's later pushes
            yield self.send(server, worker, m * header)
            yield from self.cpu(io, worker, c.worker_io.seconds(2 * m, 0))
            yield self.send(worker, server, m * header)
        # (the server's CPU for ps-lite's acknowledgement and pull request is charged with the
        # answer, one task instead of three: the same seconds on the same thread)
        yield from self.cpu(threads, server, c.server.seconds(3 * m if pslite else m, b))
        yield self.send(server, worker, b + m * header)
        yield from self.cpu(io, worker, c.worker_io.seconds(m, b))
        framework = c.worker_framework.seconds(self.messages_per_part // 2 * m, b)
        yield from self.cpu(self.main_threads[w], worker, framework)

    def _server_of(self, w: int, unit: Unit) -> int:
        """The index of the server that takes worker w's copy of `unit`."""
        return unit.server

    def _aggregated(self, iteration: int, w: int, unit: Unit):
        """Waits until the unit's server may answer worker w: every worker's copy in (and, for the
        rack simulation, its trips done)."""
        yield self.mailbox((iteration, unit.group, unit.server, unit.part), self.job.workers)
        if self.job.simulated_racks > 1:
            yield self._trips(iteration, unit)

    def mailbox(self, key, expected: int) -> simpy.Event:
        """Counts one arrival under `key`; the event fires with the `expected`-th."""
        counts = self.__dict__.setdefault("_counts", {})
        events = self.__dict__.setdefault("_events", {})
        if key not in events:
            events[key] = self.env.event()
        counts[key] = counts.get(key, 0) + 1
        if counts[key] == expected:
            events[key].succeed()
        return events[key]

    def _trips(self, iteration: int, unit: Unit) -> simpy.Event:
        """The rack simulation's trips of one unit's aggregate, started by the first worker whose
        copy found the unit complete; every worker's answer waits for the last trip."""
        key = (iteration, unit.group, unit.server, unit.part)
        trips = self.__dict__.setdefault("_trip_runs", {})
        if key not in trips:
            trips[key] = self.env.process(self._run_trips(unit))
        return trips[key]

    def _run_trips(self, unit: Unit):
        server, threads = self.servers[unit.server], self.server_threads[unit.server]
        seconds = self.costs.server.seconds(unit.messages, unit.nbytes)
        path = [link for link in (server.up, server.down) if link is not None] if self.machine.trips_on_link else []
        for _ in range(self.job.simulated_racks):
            yield from self.cpu(threads, server, seconds)  # the aggregate sent to itself
            yield self.transfer(path, (server.name, "itself"), unit.nbytes + unit.messages * PHUB_HEADER_BYTES)
            yield from self.cpu(threads, server, seconds)  # received and added again

    def _allreduce(self, iteration: int, w: int):
        """gloo's ring: N-1 reduce-scatter and N-1 allgather steps of 1/N of the gradient each,
        every step waiting for the previous step's segment from the left neighbour."""
        n, c = self.job.workers, self.costs
        total = sum(group.nbytes for group in self.groups)
        box = self.__dict__.setdefault("_ring", {})
        sends = gloo_segments(total, n)  # what one rank sends: gloo's segments of at most 1 MiB
        steps = 2 * (n - 1)
        segment, per_step = (sum(sends) / steps, len(sends) / steps) if n > 1 else (0.0, 0.0)
        for step in range(steps):
            if step:
                yield box.setdefault((iteration, w, step - 1), self.env.event())
            yield from self.cpu(self.io_threads[w], self.workers[w], c.worker_io.seconds(per_step, segment))
            right = (w + 1) % n
            self.env.process(self._ring_hop(iteration, w, right, step, segment, per_step))
        if n > 1:
            yield box.setdefault((iteration, w, steps - 1), self.env.event())
        # NAG on the whole gradient; the framework's copies of what was sent and received
        framework = c.worker_framework.seconds(2 * len(sends), 2 * sum(sends))
        yield from self.cpu(self.main_threads[w], self.workers[w], framework)
        for event in self.ready[iteration][w]:
            event.succeed()

    def _ring_hop(self, iteration, w, right, step, segment, messages):
        yield self.send(self.workers[w], self.workers[right], segment)
        yield from self.cpu(self.io_threads[right], self.workers[right],
                            self.costs.worker_io.seconds(messages, segment))
        box = self.__dict__["_ring"]
        box.setdefault((iteration, right, step), self.env.event()).succeed()


def simulate(job: Job, machine: Machine, costs: RoleCosts = RoleCosts()) -> float:
    """Predicted seconds per iteration of `job` on `machine` with `costs`."""
    if job.racks > 1:
        from .multirack import RackIteration  # a subclass of Iteration

        return RackIteration(job, machine, costs).run()
    return Iteration(job, machine, costs).run()
