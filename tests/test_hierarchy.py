"""Two-phase reduction (phub.hierarchy.HierarchicalJobState), driven directly: one state machine
per rack's server core, joined by an in-memory exchange of their events instead of sockets. Every
rack must end with rack 0's initial weights, the same bit-identical weights after every round
(the closed form), and refuse what a peer rack gets wrong."""
import numpy as np
import pytest

from phub import wire
from phub.aggregation import ReadyLane, Result
from phub.chunking import Topology
from phub.hierarchy import HierarchicalJobState, SendPartial, SendPeerInit, SendPeerReady
from phub.kernels import get_backend
from phub.optim import SGD
from conftest import refused

CHUNK_BYTES = 512
ARRAYS = [["w", 300], ["b", 7]]
LR = 0.5
WORKERS_PER_RACK = 2


def header(kind, chunk, nbytes, sender=0, iteration=0):
    return wire.Header(kind, 0, sender, chunk, iteration, nbytes)


class Racks:
    """One core's state machine per rack, and what their events make the others do."""

    def __init__(self, racks):
        self.states = [HierarchicalJobState(0, WORKERS_PER_RACK, Topology(interfaces=1, cores=1), CHUNK_BYTES, 0,
                                            get_backend("fast"), rack=r, racks=racks,
                                            total_workers=racks * WORKERS_PER_RACK) for r in range(racks)]
        self.ready = [set() for _ in range(racks)]  # (lane, batch) each rack told its workers
        self.results = [dict() for _ in range(racks)]  # chunk id -> the last result sent to workers

    def deliver(self, rack, events, hold=()):
        """Act on `rack`'s events as its transport would; SendPartials to racks in `hold` are returned."""
        held = []
        for event in events:
            if isinstance(event, SendPeerReady):
                for other in self.others(rack):
                    self.deliver(other, self.states[other].on_peer_ready(rack, event.batch))
            elif isinstance(event, SendPeerInit):
                target = self.states[event.rack]
                for chunk in event.chunks:
                    h = header(wire.Kind.INIT, chunk.chunk.id, chunk.chunk.nbytes)
                    target.peer_init_target(rack, h)[:] = chunk.weight_view
                    self.deliver(event.rack, target.on_peer_init(h))
            elif isinstance(event, SendPartial):
                for other in self.others(rack):
                    if other in hold:
                        held.append((rack, other, event, bytes(event.view)))
                    else:
                        self.land_partial(rack, other, event, bytes(event.view))
            elif isinstance(event, ReadyLane):
                self.ready[rack].add((event.lane, event.batch))
            elif isinstance(event, Result):
                self.results[rack][event.state.chunk.id] = np.frombuffer(event.state.result_view, np.float32).copy()
            else:
                raise AssertionError(f"unexpected event {event!r}")
        return held

    def land_partial(self, from_rack, rack, event, payload):
        h = header(wire.Kind.PARTIAL, event.state.chunk.id, event.state.chunk.nbytes, from_rack, event.iteration)
        self.states[rack].partial_target(from_rack, h)[:] = payload
        self.deliver(rack, self.states[rack].on_partial(from_rack, h))

    def others(self, rack):
        return [r for r in range(len(self.states)) if r != rack]

    def register_and_init(self):
        for rack, state in enumerate(self.states):
            for rank in range(WORKERS_PER_RACK):
                self.deliver(rack, state.register(rank, 0, 0, ARRAYS))
            for cid, chunk in sorted(state.owned.items()):
                h = header(wire.Kind.INIT, cid, chunk.chunk.nbytes)
                value = 1.0 if rack == 0 else 99.0  # only rack 0's initial weights may count
                state.init_target(0, h, 0)[:] = np.full(chunk.chunk.size, value, np.float32).tobytes()
                self.deliver(rack, state.on_init(h, 0))
            state.set_optimizer(0, SGD(learning_rate=LR))

    def push(self, rack, cid, rank, iteration, hold=()):
        state = self.states[rack]
        chunk = state.owned[cid].chunk
        h = header(wire.Kind.PUSH, cid, chunk.nbytes, rank, iteration)
        state.push_target(rank, h, 0)[:] = gradient(cid, chunk.size, rack, rank, iteration).tobytes()
        return self.deliver(rack, state.on_push(rank, h), hold)


def gradient(cid, size, rack, rank, iteration):
    return ((rack * WORKERS_PER_RACK + rank + 1) * iteration * (np.arange(size) % 3 + 1)).astype(np.float32)


def expected(size, racks, iteration):
    workers = racks * WORKERS_PER_RACK
    moved = LR * iteration * (iteration + 1) / 2 * workers * (workers + 1) / 2 * (np.arange(size) % 3 + 1)
    return (1 - moved).astype(np.float32)


@pytest.mark.parametrize("racks", [2, 3])
def test_every_rack_starts_from_rack_0s_weights_and_ends_each_round_identical(racks):
    bus = Racks(racks)
    bus.register_and_init()
    assert all(ready == {(0, 0)} for ready in bus.ready)
    for state in bus.states:
        for chunk in state.owned.values():
            np.testing.assert_array_equal(chunk.weight, np.ones(chunk.chunk.size, np.float32))
    for iteration in (1, 2):
        for cid in sorted(bus.states[0].owned):
            for rack in range(racks):
                for rank in range(WORKERS_PER_RACK):
                    bus.push(rack, cid, rank, iteration)
            size = bus.states[0].owned[cid].chunk.size
            for rack in range(racks):
                np.testing.assert_array_equal(bus.results[rack][cid], expected(size, racks, iteration))


def test_a_rack_one_round_ahead_keeps_both_rounds_partials_apart():
    bus = Racks(3)
    bus.register_and_init()
    cid = min(bus.states[0].owned)
    held = []
    for rack in (0, 1):  # racks 0 and 1 finish round 1; rack 2's partial of round 1 is late
        for rank in range(WORKERS_PER_RACK):
            bus.push(rack, cid, rank, 1)
    for rank in range(WORKERS_PER_RACK):
        held += bus.push(2, cid, rank, 1, hold=(0, 1))
    assert cid not in bus.results[0] and cid not in bus.results[1] and cid in bus.results[2]
    assert bus.states[0].missing_racks(bus.states[0].owned[cid]) == [2]
    for rank in range(WORKERS_PER_RACK):  # rack 2 is already in round 2: its partial lands early
        held += bus.push(2, cid, rank, 2, hold=(0, 1))
    for from_rack, rack, event, payload in held:  # round 1's late partials, then round 2's
        bus.land_partial(from_rack, rack, event, payload)
    size = bus.states[0].owned[cid].chunk.size
    for rack in (0, 1):
        np.testing.assert_array_equal(bus.results[rack][cid], expected(size, 3, 1))
        assert bus.states[rack].owned[cid].rounds == 1
    for rack in (0, 1):
        for rank in range(WORKERS_PER_RACK):
            bus.push(rack, cid, rank, 2)
    for rack in range(3):
        np.testing.assert_array_equal(bus.results[rack][cid], expected(size, 3, 2))


def test_what_a_peer_rack_gets_wrong_isrefused():
    bus = Racks(2)
    bus.register_and_init()
    rack1 = bus.states[1]
    cid, chunk = min(rack1.owned.items())
    nbytes = chunk.chunk.nbytes
    refused(lambda: rack1.peer_init_target(1, header(wire.Kind.INIT, cid, nbytes)), "only rack 0")
    refused(lambda: bus.states[0].peer_init_target(1, header(wire.Kind.INIT, cid, nbytes)), "only rack 0")
    refused(lambda: rack1.peer_init_target(0, header(wire.Kind.INIT, cid, nbytes)), "twice")
    refused(lambda: rack1.partial_target(0, header(wire.Kind.PARTIAL, cid, nbytes, 0, 3)), "round 3", "round 1")
    h = header(wire.Kind.PARTIAL, cid, nbytes, 0, 1)
    rack1.partial_target(0, h)
    rack1.on_partial(0, h)
    refused(lambda: rack1.partial_target(0, h), "twice")
    refused(lambda: rack1.on_peer_ready(0, 0), "PEER_READY for batch 0 twice")
    refused(lambda: rack1.on_peer_ready(0, -1), "PEER_READY for batch -1")


def test_a_rack_is_not_ready_before_its_peers_registered():
    bus = Racks(2)
    rack0, rack1 = bus.states
    for rank in range(WORKERS_PER_RACK):
        events = rack1.register(rank, 0, 0, ARRAYS)
    assert [type(e) for e in events] == [SendPeerReady]  # rack 1 waits only for rack 0's weights
    for rank in range(WORKERS_PER_RACK):
        events = rack0.register(rank, 0, 0, ARRAYS)
    assert events == []  # rack 0 announces itself only once its weights are in
    for cid, chunk in sorted(rack0.owned.items()):
        h = header(wire.Kind.INIT, cid, chunk.chunk.nbytes)
        rack0.init_target(0, h, 0)
        events = rack0.on_init(h, 0)
    assert [type(e) for e in events] == [SendPeerReady]
    assert not any(isinstance(e, ReadyLane) for e in events)  # rack 1 has not said it is ready
    events = rack0.on_peer_ready(1, 0)
    assert {type(e) for e in events} == {SendPeerInit, ReadyLane}
