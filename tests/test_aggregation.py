"""The aggregation state machine of one core (phub.reduction.aggregation.JobState), driven directly: no
sockets, no processes. Frames are headers plus bytes written where the state machine says they
go; every transition and every refusal is checked, and every result against the closed form."""
import numpy as np
import pytest

from phub.protocol import wire
from phub.reduction.aggregation import JobState, ReadyLane, Result
from phub.reduction.chunking import Topology
from phub.reduction.kernels import get_backend
from phub.reduction.optim import SGD, Aggregate
from conftest import refused

CHUNK_BYTES = 1024  # 256 floats: the arrays below span several chunks and lanes
ARRAYS = [["w", 1000], ["b", 10]]
LR = 0.25


def header(kind, chunk, nbytes, sender=0, iteration=0):
    return wire.Header(kind, 0, sender, chunk, iteration, nbytes)


def job(workers=3, topology=None, core=0, backend="fast"):
    return JobState(0, workers, topology or Topology(interfaces=2, cores=1), CHUNK_BYTES, core, get_backend(backend))


def register_all(state, workers):
    events = []
    for lane in sorted(state.lanes):
        for rank in range(workers):
            events += state.register(rank, lane, 0, ARRAYS)
    return events


def init_all(state, value=1.0):
    events = []
    for cid, chunk in sorted(state.owned.items()):
        h = header(wire.Kind.INIT, cid, chunk.chunk.nbytes)
        state.init_target(0, h, chunk.chunk.lane)[:] = np.full(chunk.chunk.size, value, np.float32).tobytes()
        events += state.on_init(h, chunk.chunk.lane)
    return events


def ready_job(workers=3, optimizer=None, **kwargs):
    state = job(workers, **kwargs)
    register_all(state, workers)
    init_all(state)
    for lane in state.lanes:
        state.set_optimizer(lane, optimizer or SGD(learning_rate=LR))
    return state


def gradient(cid, size, rank, iteration):
    return ((rank + 1) * iteration * (np.arange(size) % 5 + cid)).astype(np.float32)


def push(state, cid, rank, iteration):
    chunk = state.owned[cid].chunk
    h = header(wire.Kind.PUSH, cid, chunk.nbytes, rank, iteration)
    state.push_target(rank, h, chunk.lane)[:] = gradient(cid, chunk.size, rank, iteration).tobytes()
    return state.on_push(rank, h)


def result_array(event):
    return np.frombuffer(event.state.result_view, dtype=np.float32)


def test_a_lane_is_ready_once_every_worker_registered_it_and_rank_0_initialized_it():
    state = job(workers=2)
    lane = min(state.lanes)
    assert state.register(0, lane, 0, ARRAYS) == []
    assert state.register(1, lane, 0, ARRAYS) == []  # registered, not initialized
    events = []
    for cid, chunk in sorted(state.owned.items()):
        if chunk.chunk.lane == lane:
            h = header(wire.Kind.INIT, cid, chunk.chunk.nbytes)
            state.init_target(0, h, lane)[:] = bytes(chunk.chunk.nbytes)
            events += state.on_init(h, lane)
    assert [type(e) for e in events] == [ReadyLane] and events[0].lane == lane and events[0].batch == 0
    assert {s.chunk.id for s in events[0].chunks} == {s.chunk.id for s in state.lane_states(lane)}
    other = max(state.lanes)
    assert other != lane and state.register(0, other, 0, ARRAYS) == []  # the other lane still waits


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_a_round_completes_on_the_last_copy_with_the_closed_form_weights(workers, backend):
    state = ready_job(workers, backend=backend)
    for iteration in (1, 2, 3):
        for cid in sorted(state.owned):
            events = [push(state, cid, rank, iteration) for rank in range(workers)]
            assert all(e == [] for e in events[:-1]) and [type(e) for e in events[-1]] == [Result]
            size = state.owned[cid].chunk.size
            # w = 1 - lr * sum over iterations j <= k and ranks r of (r + 1) * j * (i % 5 + cid)
            moved = LR * (iteration * (iteration + 1) / 2) * (workers * (workers + 1) / 2) * (np.arange(size) % 5 + cid)
            np.testing.assert_array_equal(result_array(events[-1][0]), (1 - moved).astype(np.float32))
            assert state.owned[cid].rounds == iteration
    assert state.pending() == []


def test_aggregation_only_returns_the_sum_or_the_mean_and_leaves_the_weights():
    for average, scale in ((False, 1.0), (True, 1 / 4)):
        state = ready_job(4, optimizer=Aggregate(average=average))
        cid = min(state.owned)
        [event] = [e for rank in range(4) for e in push(state, cid, rank, 1)]
        size = state.owned[cid].chunk.size
        want = (10 * (np.arange(size) % 5 + cid) * scale).astype(np.float32)  # (1+2+3+4) * 1 * ...
        np.testing.assert_allclose(result_array(event), want, rtol=1e-6)
        np.testing.assert_array_equal(state.owned[cid].weight, np.ones(size, np.float32))


def test_the_optimizer_is_kept_per_lane():
    state = ready_job(2, topology=Topology(interfaces=1, cores=1, lanes_per_pair=2))
    first, second = sorted(state.lanes)
    state.set_optimizer(second, Aggregate())
    by_lane = {}
    for cid, chunk in state.owned.items():
        push(state, cid, 0, 1)
        [event] = push(state, cid, 1, 1)
        by_lane.setdefault(chunk.chunk.lane, []).append(result_array(event)[1])  # element 1: i % 5 = 1
    assert all(v < 1 for v in by_lane[first])  # SGD moved the weights below their initial 1.0
    assert all(v >= 3 for v in by_lane[second])  # the aggregate (1 + 2) * 1 * (1 + cid)


def test_pending_and_missing_name_the_workers_a_round_waits_for():
    state = ready_job(3)
    cid = min(state.owned)
    push(state, cid, 2, 1)
    assert [s.chunk.id for s in state.pending()] == [cid]
    assert state.owned[cid].missing(3) == [0, 1]


def test_bad_registrations_are_refused_naming_the_rank():
    state = job(workers=2)
    lane = min(state.lanes)
    refused(lambda: state.register(0, lane, 0, [["w", "many"]]), "rank 0", "malformed REGISTER")
    refused(lambda: state.register(0, lane, 1, ARRAYS), "rank 0", "batch 1 before batch 0")
    refused(lambda: state.register(0, lane, 0, []), "rank 0", "invalid batch 0")
    state.register(0, lane, 0, ARRAYS)
    refused(lambda: state.register(0, lane, 0, ARRAYS), "rank 0", "twice")
    refused(lambda: state.register(1, lane, 0, [["w", 999], ["b", 10]]), "rank 1", "different arrays")


def test_bad_initial_weights_arerefused():
    state = job(workers=2)
    register_all(state, 2)
    cid, chunk = min(state.owned.items())
    h = header(wire.Kind.INIT, cid, chunk.chunk.nbytes, sender=1)
    refused(lambda: state.init_target(1, h, chunk.chunk.lane), "rank 1", "only the first worker")
    h = header(wire.Kind.INIT, cid, chunk.chunk.nbytes)
    state.init_target(0, h, chunk.chunk.lane)
    state.on_init(h, chunk.chunk.lane)
    refused(lambda: state.init_target(0, h, chunk.chunk.lane), "initialized twice")


def test_bad_pushes_are_refused_naming_what_is_wrong():
    state = job(workers=2)
    register_all(state, 2)
    cid, chunk = min(state.owned.items())
    lane, nbytes = chunk.chunk.lane, chunk.chunk.nbytes
    refused(lambda: state.push_target(0, header(wire.Kind.PUSH, cid, nbytes, 0, 1), lane), "before it was initialized")
    init_all(state)
    refused(lambda: state.push_target(0, header(wire.Kind.PUSH, cid, nbytes, 0, 2), lane), "iteration 2, expected 1")
    refused(lambda: state.push_target(0, header(wire.Kind.PUSH, cid, nbytes - 4, 0, 1), lane), "payload bytes")
    refused(lambda: state.push_target(0, header(wire.Kind.PUSH, 10**6, nbytes, 0, 1), lane), "the plan has chunks")
    other_lane = next(c.chunk.lane for c in state.owned.values() if c.chunk.lane != lane)
    refused(lambda: state.push_target(0, header(wire.Kind.PUSH, cid, nbytes, 0, 1), other_lane),
             "does not carry")
    push(state, cid, 0, 1)
    refused(lambda: state.push_target(0, header(wire.Kind.PUSH, cid, nbytes, 0, 1), lane), "twice in iteration 1")


def test_a_core_owns_only_the_chunks_of_its_lanes():
    topology = Topology(interfaces=1, cores=2)
    states = [job(2, topology=topology, core=core) for core in (0, 1)]
    for state in states:
        register_all(state, 2)
    owned = [set(state.owned) for state in states]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    assert owned[0] | owned[1] == set(range(len(states[0].chunk_nbytes)))
    foreign = min(owned[1])
    refused(lambda: states[0].owned_chunk(header(wire.Kind.PUSH, foreign, states[0].chunk_nbytes[foreign])),
             "does not carry")


def test_optimizer_state_loads_only_from_rank_0_after_initialization():
    state = job(workers=2)
    register_all(state, 2)
    cid, chunk = min(state.owned.items())
    h = header(wire.Kind.STATE, cid, chunk.chunk.nbytes)
    refused(lambda: state.state_target(1, h, chunk.chunk.lane), "only the first worker")
    refused(lambda: state.state_target(0, h, chunk.chunk.lane), "before it was initialized")
    init_all(state)
    view = state.state_target(0, h, chunk.chunk.lane)
    view[:] = np.full(chunk.chunk.size, 2.0, np.float32).tobytes()
    np.testing.assert_array_equal(state.owned[cid].mom, np.full(chunk.chunk.size, 2.0, np.float32))
