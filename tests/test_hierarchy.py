"""Two-phase reduction (phub.reduction.hierarchy.HierarchicalJobState), driven directly: one state machine
per (rack, core) of PBoxes with several cores and interfaces, joined by in-memory links, one per
(rack pair, core, interface), that deliver in a random (seeded) interleaving instead of sockets.
Every rack must end with rack 0's initial weights, the same bit-identical weights after every
round (the closed form), send each chunk on its own interface's link, move 2(R-1)/R of the model
per round (reduce-scatter / all-gather, not a broadcast), and refuse what a peer rack gets wrong."""
import random
from collections import deque

import numpy as np
import pytest

from phub.protocol import wire
from phub.reduction.aggregation import ReadyLane, Result
from phub.reduction.chunking import ChunkPlan, Topology
from phub.reduction.hierarchy import (HierarchicalJobState, SendPartial, SendPeerInit, SendPeerReady, SendTotal,
                                      SimulatedRacksJobState, owner_racks)
from phub.reduction.kernels import get_backend
from phub.reduction.optim import SGD
from conftest import refused

CHUNK_BYTES = 512  # 128 floats
ARRAYS = [["w", 1500], ["b", 7], ["v", 300]]  # 16 chunks: about 4 per (core, interface) below
LR = 0.5
WORKERS_PER_RACK = 2
SHAPE = Topology(interfaces=2, cores=2)
K = wire.Kind


def header(kind, chunk, nbytes, sender=0, iteration=0):
    return wire.Header(kind, 0, sender, chunk, iteration, nbytes)


class Racks:
    """Every (rack, core)'s state machine, and the links between them: a FIFO per (from rack, to
    rack, core, interface), delivered in the order a seeded random generator picks."""

    def __init__(self, racks, topology=SHAPE, seed=0):
        self.topology = topology
        self.states = [[HierarchicalJobState(0, WORKERS_PER_RACK, topology, CHUNK_BYTES, core, get_backend("fast"),
                                             rack=r, racks=racks, total_workers=racks * WORKERS_PER_RACK)
                        for core in range(topology.cores)] for r in range(racks)]
        self.links = {}  # (from, to, core, interface) -> deque of frames in flight
        self.sent_bytes = {}  # (from, to, interface) -> data bytes sent
        self.ready = [set() for _ in range(racks)]  # (lane, batch) each rack told its workers
        self.results = [dict() for _ in range(racks)]  # chunk id -> the last result sent to workers
        self.random = random.Random(seed)

    @property
    def racks(self):
        return len(self.states)

    def chunk_ids(self, core):
        return sorted(self.states[0][core].owned)

    def send(self, rack, to, core, interface, kind, cid=0, iteration=0, payload=b""):
        self.links.setdefault((rack, to, core, interface), deque()).append((kind, cid, iteration, bytes(payload)))
        if payload:
            key = (rack, to, interface)
            self.sent_bytes[key] = self.sent_bytes.get(key, 0) + len(payload)

    def act(self, rack, core, events):
        """What the rack's core sends for its events (as phub.protocol.core does)."""
        state = self.states[rack][core]
        for event in events:
            if isinstance(event, SendPeerReady):  # control frames: interface 0's link
                for other in self.others(rack):
                    self.send(rack, other, core, 0, K.PEER_READY, event.batch)
            elif isinstance(event, SendPeerInit):
                for chunk in event.chunks:
                    self.send(rack, event.rack, core, state.interface_of(chunk.chunk.id), K.INIT, chunk.chunk.id,
                              0, chunk.weight_view)
            elif isinstance(event, SendPartial):
                assert event.owner != rack
                self.send(rack, event.owner, core, state.interface_of(event.state.chunk.id), K.PARTIAL,
                          event.state.chunk.id, event.iteration, event.view)
            elif isinstance(event, SendTotal):
                for other in self.others(rack):
                    self.send(rack, other, core, state.interface_of(event.state.chunk.id), K.TOTAL,
                              event.state.chunk.id, event.iteration, event.view)
            elif isinstance(event, ReadyLane):
                self.ready[rack].add((event.lane, event.batch))
            elif isinstance(event, Result):
                self.results[rack][event.state.chunk.id] = np.frombuffer(event.state.result_view, np.float32).copy()
            else:
                raise AssertionError(f"unexpected event {event!r}")

    def deliver(self, link):
        """The next frame on `link` lands at its receiver, as a link hands it to the protocol."""
        rack, to, core, interface = link
        kind, cid, iteration, payload = self.links[link].popleft()
        state = self.states[to][core]
        if kind is K.PEER_READY:
            return self.act(to, core, state.on_peer_ready(rack, cid))
        h = header(kind, cid, len(payload), rack, iteration)
        target, landed = {K.INIT: (state.peer_init_target, state.on_peer_init),
                          K.PARTIAL: (state.partial_target, lambda h: state.on_partial(rack, h)),
                          K.TOTAL: (state.total_target, lambda h: state.on_total(rack, h))}[kind]
        target(rack, h, interface)[:] = payload
        self.act(to, core, landed(h))

    def pump(self, at_most=None):
        """Deliver frames in flight, a random link's next one at a time (all of them by default)."""
        moved = 0
        while at_most is None or moved < at_most:
            busy = [link for link, frames in self.links.items() if frames]
            if not busy:
                return
            self.deliver(self.random.choice(sorted(busy)))
            moved += 1

    def others(self, rack):
        return [r for r in range(self.racks) if r != rack]

    def register_and_init(self):
        for rack, cores in enumerate(self.states):
            for core, state in enumerate(cores):
                for lane in sorted(state.lanes):
                    for rank in range(WORKERS_PER_RACK):
                        self.act(rack, core, state.register(rank, lane, 0, ARRAYS))
                for cid, chunk in sorted(state.owned.items()):
                    h = header(K.INIT, cid, chunk.chunk.nbytes)
                    value = 1.0 if rack == 0 else 99.0  # only rack 0's initial weights may count
                    weights = np.full(chunk.chunk.size, value, np.float32)
                    state.init_target(0, h, chunk.chunk.lane)[:] = weights.tobytes()
                    self.act(rack, core, state.on_init(h, chunk.chunk.lane))
                for lane in state.lanes:
                    state.set_optimizer(lane, SGD(learning_rate=LR))
            self.pump(3)  # some frames travel while the other racks are still registering
        self.pump()

    def push(self, rack, core, cid, rank, iteration):
        state = self.states[rack][core]
        chunk = state.owned[cid].chunk
        h = header(K.PUSH, cid, chunk.nbytes, rank, iteration)
        state.push_target(rank, h, chunk.lane)[:] = gradient(cid, chunk.size, rack, rank, iteration).tobytes()
        self.act(rack, core, state.on_push(rank, h))

    def run_round(self, iteration):
        """Every worker of every rack pushes every chunk, in a random order, with frames between racks
        delivered in between; then everything in flight lands."""
        pushes = [(rack, core, cid, rank) for rack in range(self.racks) for core in range(self.topology.cores)
                  for cid in self.chunk_ids(core) for rank in range(WORKERS_PER_RACK)]
        self.random.shuffle(pushes)
        for rack, core, cid, rank in pushes:
            self.push(rack, core, cid, rank, iteration)
            self.pump(self.random.randrange(3))
        self.pump()


def gradient(cid, size, rack, rank, iteration):
    return ((rack * WORKERS_PER_RACK + rank + 1) * iteration * (np.arange(size) % 3 + 1)).astype(np.float32)


def expected(size, racks, iteration):
    """The weights after `iteration` SGD rounds from 1.0 (every value exact in float32)."""
    workers = racks * WORKERS_PER_RACK
    moved = LR * iteration * (iteration + 1) / 2 * workers * (workers + 1) / 2 * (np.arange(size) % 3 + 1)
    return (1 - moved).astype(np.float32)


@pytest.mark.parametrize("racks, seed", [(2, 0), (3, 1), (4, 2)])
def test_every_rack_ends_each_round_with_the_same_bits_as_the_closed_form(racks, seed):
    bus = Racks(racks, seed=seed)
    bus.register_and_init()
    lanes = {(lane, 0) for lane in range(SHAPE.lanes)}
    assert all(ready == lanes for ready in bus.ready)
    for cores in bus.states:  # rack 0's initial weights everywhere
        for state in cores:
            for chunk in state.owned.values():
                np.testing.assert_array_equal(chunk.weight, np.ones(chunk.chunk.size, np.float32))
    for iteration in (1, 2, 3):
        bus.run_round(iteration)
        for core in range(SHAPE.cores):
            for cid in bus.chunk_ids(core):
                size = bus.states[0][core].owned[cid].chunk.size
                for rack in range(racks):
                    np.testing.assert_array_equal(bus.results[rack][cid], expected(size, racks, iteration))
                    assert bus.states[rack][core].owned[cid].weight.tobytes() == \
                        bus.states[0][core].owned[cid].weight.tobytes(), f"rack {rack} chunk {cid}"


def test_each_chunk_travels_on_its_interface_and_a_rack_sends_2_r_minus_1_over_r_of_the_model():
    racks = 4
    bus = Racks(racks, seed=3)
    bus.register_and_init()
    bus.sent_bytes.clear()  # the initial weights are sent once, before training
    bus.run_round(1)
    model = sum(n for _, n in ARRAYS) * 4
    for rack in range(racks):
        for interface in range(SHAPE.interfaces):
            mine = [(s.owned[cid].chunk.nbytes, s.owner[cid] == rack) for s in bus.states[rack] for cid in s.owned
                    if s.interface_of(cid) == interface]
            out = sum(n for (src, _, i), n in bus.sent_bytes.items() if src == rack and i == interface)
            into = sum(n for (_, dst, i), n in bus.sent_bytes.items() if dst == rack and i == interface)
            # each link carries its own chunks only: a partial of each chunk another rack owns, the
            # total of each chunk this rack owns to every other rack (and as much comes back) ...
            assert out == into == sum(n * (racks - 1) if owned else n for n, owned in mine), (rack, interface)
            # ... which is 2(R-1)/R of the interface's chunks, within a chunk per (core, interface)
            share = 2 * (racks - 1) / racks * sum(n for n, _ in mine)
            assert abs(out - share) <= (racks - 1) * SHAPE.cores * CHUNK_BYTES, (rack, interface, out, share)
            assert abs(into - share) <= (racks - 1) * SHAPE.cores * CHUNK_BYTES, (rack, interface, into, share)
        total_out = sum(n for (src, _, _), n in bus.sent_bytes.items() if src == rack)
        assert total_out < (racks - 1) * model * 0.6  # a broadcast would send models


def test_owners_are_balanced_per_core_and_interface_and_the_same_for_every_rack():
    topology = Topology(interfaces=2, cores=3)
    plan = ChunkPlan(topology, CHUNK_BYTES)
    loads = {}
    owners = owner_racks(plan.add_arrays([("a", 128 * 50 + 5), ("b", 128 * 31)]), topology, 3, loads)
    owners.update(owner_racks(plan.add_arrays([("c", 128 * 20)]), topology, 3, loads))
    assert set(owners) == {c.id for c in plan.chunks} and set(owners.values()) == {0, 1, 2}
    for pair, per_rack in loads.items():
        assert max(per_rack) - min(per_rack) <= CHUNK_BYTES, (pair, per_rack)
    again = ChunkPlan(topology, CHUNK_BYTES)  # another server computes the same owners
    same = owner_racks(again.add_arrays([("a", 128 * 50 + 5), ("b", 128 * 31)]), topology, 3, {})
    assert same == {cid: rack for cid, rack in owners.items() if cid in same}


def test_what_a_peer_rack_gets_wrong_is_refused():
    bus = Racks(3)
    bus.register_and_init()
    core = 0
    states = [bus.states[r][core] for r in range(3)]
    cid = bus.chunk_ids(core)[0]
    owner = states[0].owner[cid]
    other, third = [r for r in range(3) if r != owner]
    nbytes = states[0].owned[cid].chunk.nbytes
    interface = states[0].interface_of(cid)
    wrong = 1 - interface

    def partial(iteration=1, sender=other):
        return header(K.PARTIAL, cid, nbytes, sender, iteration)

    refused(lambda: states[third].partial_target(other, partial(), interface), f"rack {owner} owns that chunk")
    refused(lambda: states[owner].partial_target(other, partial(), wrong),
            f"on interface {wrong}'s link", f"on interface {interface}")
    refused(lambda: states[owner].partial_target(other, partial(3), interface), "round 3", "round 1")
    states[owner].partial_target(other, partial(), interface)
    states[owner].on_partial(other, partial())
    refused(lambda: states[owner].partial_target(other, partial(), interface), "twice")
    total = header(K.TOTAL, cid, nbytes, owner, 1)
    refused(lambda: states[other].total_target(owner, total, interface), "before this rack sent its partial")
    refused(lambda: states[other].total_target(third, total, interface), f"rack {owner} owns it")
    refused(lambda: states[owner].total_target(owner, total, interface), "to itself")
    if owner != 0:
        refused(lambda: states[owner].peer_init_target(0, header(K.INIT, cid, nbytes), interface), "twice")
    refused(lambda: states[0].peer_init_target(1, header(K.INIT, cid, nbytes), interface), "only rack 0")
    refused(lambda: states[1].on_peer_ready(0, 0), "PEER_READY for batch 0 twice")
    refused(lambda: states[1].on_peer_ready(0, -1), "PEER_READY for batch -1")


def test_a_stalled_round_names_the_rack_it_waits_for():
    bus = Racks(2, topology=Topology())
    bus.register_and_init()
    rack0, rack1 = bus.states[0][0], bus.states[1][0]
    cid = next(c for c in bus.chunk_ids(0) if rack0.owner[c] == 1)  # rack 1 sums it
    for rank in range(WORKERS_PER_RACK):
        bus.push(0, 0, cid, rank, 1)
    assert rack0.missing_racks(rack0.owned[cid]) == [1]  # rack 0 waits for rack 1's total
    bus.pump()
    assert rack1.missing_racks(rack1.owned[cid]) == [1]  # rack 1 has rack 0's partial, not its own


def test_a_rack_is_not_ready_before_its_peers_registered():
    bus = Racks(2, topology=Topology())
    rack0, rack1 = (cores[0] for cores in bus.states)
    for rank in range(WORKERS_PER_RACK):
        events = rack1.register(rank, 0, 0, ARRAYS)
    assert [type(e) for e in events] == [SendPeerReady]  # rack 1 waits only for rack 0's weights
    for rank in range(WORKERS_PER_RACK):
        events = rack0.register(rank, 0, 0, ARRAYS)
    assert events == []  # rack 0 announces itself only once its weights are in
    for cid, chunk in sorted(rack0.owned.items()):
        h = header(K.INIT, cid, chunk.chunk.nbytes)
        rack0.init_target(0, h, 0)
        events = rack0.on_init(h, 0)
    assert [type(e) for e in events] == [SendPeerReady]
    assert not any(isinstance(e, ReadyLane) for e in events)  # rack 1 has not said it is ready
    events = rack0.on_peer_ready(1, 0)
    assert {type(e) for e in events} == {SendPeerInit, ReadyLane}


# -- one PBox simulating racks (the paper's method) ---------------------------------------------
def test_a_simulated_rack_sends_each_aggregate_to_itself_once_per_rack_before_the_optimizer():
    racks = 3
    state = SimulatedRacksJobState(0, WORKERS_PER_RACK, SHAPE, CHUNK_BYTES, 1, get_backend("fast"), racks=racks)
    for lane in sorted(state.lanes):
        for rank in range(WORKERS_PER_RACK):
            state.register(rank, lane, 0, ARRAYS)
    for cid, chunk in sorted(state.owned.items()):
        h = header(K.INIT, cid, chunk.chunk.nbytes)
        state.init_target(0, h, chunk.chunk.lane)[:] = np.ones(chunk.chunk.size, np.float32).tobytes()
        state.on_init(h, chunk.chunk.lane)
    for lane in state.lanes:
        state.set_optimizer(lane, SGD(learning_rate=LR))
    for cid, chunk in sorted(state.owned.items()):
        size, lane = chunk.chunk.size, chunk.chunk.lane
        events = []
        for rank in range(WORKERS_PER_RACK):
            h = header(K.PUSH, cid, chunk.chunk.nbytes, rank, 1)
            state.push_target(rank, h, lane)[:] = gradient(cid, size, 0, rank, 1).tobytes()
            events = state.on_push(rank, h)
        trips = 0
        while not isinstance(events[0], Result):  # one trip at a time, on the chunk's interface
            [trip] = events
            assert isinstance(trip, SendPartial) and trip.owner == 0 and trip.iteration == 1
            back = header(K.PARTIAL, cid, chunk.chunk.nbytes, 0, 1)
            interface = state.interface_of(cid)
            refused(lambda: state.partial_target(0, back, 1 - interface), "came back on interface")
            state.partial_target(0, back, interface)[:] = trip.view
            events = state.on_partial(0, back)
            trips += 1
        assert trips == racks
        # racks x the rack's sum (1 + 2) x the pattern: the closed form of 3 racks pushing the same
        want = (1 - LR * racks * 3 * (np.arange(size) % 3 + 1)).astype(np.float32)
        np.testing.assert_array_equal(np.frombuffer(events[0].state.result_view, np.float32), want)
        refused(lambda: state.partial_target(0, header(K.PARTIAL, cid, chunk.chunk.nbytes, 0, 1), None),
                "never sent")
    assert state.total_workers == racks * WORKERS_PER_RACK  # what an averaging optimizer divides by
