"""The verbs transport's device-independent parts: immediates, the registration plan, slot addressing."""
import random
import struct

import numpy as np
import pytest

from phub.protocol import wire
from phub.reduction.aggregation import JobState, Result
from phub.reduction.chunking import ChunkPlan, Topology
from phub.errors import ConfigError, ProtocolError
from phub.reduction.kernels import get_backend
from phub.network.rdma import immediate
from phub.network.rdma.layout import PAGE_BYTES, CoreRegistration, WorkerRegistration, core_lanes, remote_slots

# -- immediate ------------------------------------------------------------------------------


def test_immediate_bit_split_and_round_trip():
    assert immediate.RANK_BITS + immediate.CHUNK_BITS == 32
    assert immediate.encode(1, 0) == 1 << 20 and immediate.encode(0, 1) == 1
    assert immediate.encode(4095, 2**20 - 1) == 0xFFFFFFFF
    rng = random.Random(7)
    cases = [(0, 0), (4095, 0), (0, 2**20 - 1), (4095, 2**20 - 1)]
    cases += [(rng.randrange(4096), rng.randrange(2**20)) for _ in range(500)]
    for rank, chunk in cases:
        imm = immediate.encode(rank, chunk)
        assert 0 <= imm < 2**32
        assert immediate.decode(imm) == (rank, chunk)
        # the work request field is big-endian: its host-order bytes are the value's network bytes
        assert struct.pack("=I", immediate.to_wire(imm)) == struct.pack(">I", imm)
        assert immediate.from_wire(immediate.to_wire(imm)) == imm


@pytest.mark.parametrize("rank, chunk, message", [
    (4096, 0, "rank 4096 does not fit"),
    (-1, 0, "rank -1 does not fit"),
    (True, 0, "rank True does not fit"),
    (0, 2**20, "chunk id 1048576 does not fit"),
    (0, -5, "chunk id -5 does not fit"),
    (0, 1.0, "chunk id 1.0 does not fit"),
])
def test_immediate_rejects_values_outside_its_fields(rank, chunk, message):
    with pytest.raises(ConfigError, match=message):
        immediate.encode(rank, chunk)


@pytest.mark.parametrize("imm", [-1, 2**32, "1", None])
def test_decode_rejects_non_32_bit_values(imm):
    with pytest.raises(ProtocolError, match="32-bit"):
        immediate.decode(imm)


def test_check_job_names_the_limit_and_what_to_change():
    immediate.check_job(4096, 2**20)  # the largest job that fits
    with pytest.raises(ConfigError, match="job 3 has 4097 workers.*at most 4096 ranks"):
        immediate.check_job(4097, 10, job_id=3)
    with pytest.raises(ConfigError, match=r"2097152 chunks.*below 1048576: use --chunk-bytes 65536 or more"):
        immediate.check_job(8, 2 * 2**20, chunk_bytes=32768)
    with pytest.raises(ConfigError, match="use the tcp transport"):
        immediate.check_job(8, 2**20 + 1)


# -- a real aggregation state, pushed into by "RDMA" (writes straight into the slots) ------------
def ready_state(num_workers=3, cores=2, sizes=(5000, 20000, 300), chunk_bytes=4096, core=0):
    topology = Topology(interfaces=2, cores=cores)
    state = JobState(0, num_workers, topology, chunk_bytes, core, get_backend("reference"))
    arrays = [[f"a{i}", n] for i, n in enumerate(sizes)]
    for lane in sorted(state.lanes):
        for rank in range(num_workers):
            state.register(rank, lane, 0, arrays)
    for cid, chunk_state in state.owned.items():
        header = wire.Header(wire.Kind.INIT, 0, 0, cid, 0, chunk_state.chunk.nbytes)
        state.init_target(0, header, chunk_state.chunk.lane)
        state.on_init(header, chunk_state.chunk.lane)
    return state


def test_push_completions_drive_the_aggregation_like_tcp_pushes():
    state = ready_state()
    rng = np.random.default_rng(1)
    for cid, chunk_state in state.owned.items():
        lane, nbytes = chunk_state.chunk.lane, chunk_state.chunk.nbytes
        grads = [rng.standard_normal(chunk_state.chunk.size).astype(np.float32) for _ in range(3)]
        events = []
        for rank, grad in enumerate(grads):
            chunk_state.slots[rank][:] = grad  # what the NIC does before the completion arrives
            header = immediate.push_header(immediate.encode(rank, cid), nbytes, lane=lane, rank=rank,
                                           local=rank, state=state)
            assert (header.sender, header.chunk, header.iteration, header.length) == (rank, cid, 1, nbytes)
            events = state.on_push(rank, header)
        assert len(events) == 1 and isinstance(events[0], Result)
        got = np.frombuffer(events[0].state.result_view, dtype=np.float32)
        np.testing.assert_allclose(got, grads[0] + grads[1] + grads[2], rtol=1e-6)


def test_push_completion_checks_name_the_culprit():
    state = ready_state()
    cid, chunk_state = next(iter(state.owned.items()))
    lane, nbytes = chunk_state.chunk.lane, chunk_state.chunk.nbytes
    with pytest.raises(ProtocolError, match="rank 1's queue pair carries rank 2"):
        immediate.push_header(immediate.encode(2, cid), nbytes, lane=lane, rank=1, local=1, state=state)
    with pytest.raises(ProtocolError, match=f"has {nbytes - 4} payload bytes"):
        immediate.push_header(immediate.encode(1, cid), nbytes - 4, lane=lane, rank=1, local=1, state=state)
    other_lane = next(lane_ for lane_ in state.lanes if lane_ != lane)
    with pytest.raises(ProtocolError, match="does not carry"):
        immediate.push_header(immediate.encode(1, cid), nbytes, lane=other_lane, rank=1, local=1, state=state)
    foreign = next(c.id for c in state.plan.chunks if c.id not in state.owned)
    with pytest.raises(ProtocolError, match=f"chunk {foreign}"):
        immediate.push_header(immediate.encode(1, foreign), nbytes, lane=lane, rank=1, local=1, state=state)
    header = immediate.push_header(immediate.encode(1, cid), nbytes, lane=lane, rank=1, local=1, state=state)
    state.on_push(1, header)
    with pytest.raises(ProtocolError, match="twice"):
        immediate.push_header(immediate.encode(1, cid), nbytes, lane=lane, rank=1, local=1, state=state)


# -- registration plan and slot addressing --------------------------------------------------
def make_plan(interfaces, cores, lanes_per_pair=1, chunk_bytes=4096, batches=((5000, 17, 2048), (33333,))):
    plan = ChunkPlan(Topology(interfaces, cores, lanes_per_pair), chunk_bytes)
    for b, sizes in enumerate(batches):
        plan.add_arrays([(f"b{b}k{i}", n) for i, n in enumerate(sizes)])
    return plan


@pytest.mark.parametrize("interfaces, cores, lanes_per_pair, workers",
                         [(1, 1, 1, 1), (1, 2, 1, 3), (2, 2, 1, 4), (3, 2, 2, 2), (2, 3, 1, 5)])
def test_registration_plan_puts_every_slot_in_exactly_one_region(interfaces, cores, lanes_per_pair, workers):
    plan = make_plan(interfaces, cores, lanes_per_pair)
    owners = core_lanes(plan)
    assert sorted(lane for lanes in owners.values() for lane in lanes) == list(range(plan.topology.lanes))
    seen_chunks = []
    for (_, core), lanes in owners.items():
        reg = CoreRegistration(plan, lanes, workers)
        owned = [c for c in plan.chunks if c.lane in lanes]
        seen_chunks += [c.id for c in owned]
        assert reg.interfaces == tuple(sorted({plan.topology.lane_interface(lane) for lane in lanes}))
        for interface, length in reg.regions():
            assert length % PAGE_BYTES == 0 and length > 0
            for blocks in reg.blocks[interface]:
                assert blocks.slots % PAGE_BYTES == 0 and blocks.weights % PAGE_BYTES == 0
                assert blocks.results % PAGE_BYTES == 0 and blocks.end <= length
        spans = {i: [] for i in reg.interfaces}  # (offset, end, what) per region
        for c in owned:
            nic = plan.topology.lane_interface(c.lane)
            for rank in range(workers):
                spans[nic].append(reg.slot(c.id, rank))
            spans[nic] += [reg.weights(c.id), reg.result(c.id)]
        for interface, items in spans.items():
            assert all(s.interface == interface and s.nbytes > 0 and s.offset % 4 == 0 for s in items)
            assert all(0 <= s.offset and s.end <= reg.length[interface] for s in items)
            items.sort(key=lambda s: s.offset)
            for a, b in zip(items, items[1:]):
                assert a.end <= b.offset, f"{a} overlaps {b}"
        slot_bytes = sum(reg.slot(c.id, r).nbytes for c in owned for r in range(workers))
        assert slot_bytes == workers * sum(c.nbytes for c in owned)
        unowned = [c for c in plan.chunks if c.lane not in lanes]
        for c in unowned[:3]:
            assert not reg.owns(c.id)
            with pytest.raises(ConfigError, match=f"chunk {c.id} is not owned"):
                reg.slot(c.id, 0)
    assert sorted(seen_chunks) == list(range(len(plan.chunks)))  # every chunk has exactly one owner


def test_slot_layout_matches_the_aggregation_arrays():
    """With one NIC per core, each batch's slot and weight blocks are the aggregation arrays' layout."""
    workers, topology, chunk_bytes = 3, Topology(interfaces=1, cores=2), 4096
    batches = [[["w0", 5000], ["w1", 17], ["w2", 9000]], [["v", 12345]]]
    for core in range(topology.cores):
        state = JobState(0, workers, topology, chunk_bytes, core, get_backend("reference"))
        for batch, arrays in enumerate(batches):
            for lane in sorted(state.lanes):
                for rank in range(workers):
                    state.register(rank, lane, batch, arrays)
        reg = CoreRegistration.for_job_state(state)
        [nic] = reg.interfaces
        assert set(reg._where) == set(state.owned)
        for blocks in reg.blocks[nic]:
            first = state.owned[blocks.chunk_ids[0]]
            slot_base = first.slots[0].__array_interface__["data"][0]
            weight_base = first.weight.__array_interface__["data"][0]
            for cid in blocks.chunk_ids:
                chunk_state = state.owned[cid]
                for rank in range(workers):
                    agg = chunk_state.slots[rank].__array_interface__["data"][0] - slot_base
                    span = reg.slot(cid, rank)
                    assert span.offset - blocks.slots == agg and span.nbytes == chunk_state.slots[rank].nbytes
                assert reg.weights(cid).offset - blocks.weights == \
                    chunk_state.weight.__array_interface__["data"][0] - weight_base


def test_adding_a_batch_never_moves_earlier_slots():
    plan = make_plan(2, 2, batches=((5000, 300),))
    lanes = core_lanes(plan)[(0, 1)]
    reg = CoreRegistration(plan, lanes, 2)
    before = {c.id: [reg.slot(c.id, r) for r in range(2)] for c in plan.chunks if reg.owns(c.id)}
    plan.add_arrays([("late", 40000)])
    assert reg.extend() == [1] and reg.extend() == []
    fresh = CoreRegistration(plan, lanes, 2)
    for cid, spans in before.items():
        assert [reg.slot(cid, r) for r in range(2)] == spans == [fresh.slot(cid, r) for r in range(2)]
    assert reg.length == fresh.length
    assert any(reg.owns(c.id) for c in plan.chunks if c.batch == 1)


def test_worker_addresses_what_the_owning_core_registered():
    plan = make_plan(2, 2, 2)
    server_side = {owner: CoreRegistration(plan, lanes, 3) for owner, lanes in core_lanes(plan).items()}
    worker_side = remote_slots(plan, 3)
    for c in plan.chunks:
        owner = (0, plan.topology.lane_core(c.lane))
        for rank in range(3):
            assert worker_side[owner].slot(c.id, rank) == server_side[owner].slot(c.id, rank)


def test_worker_registration_keeps_each_array_contiguous():
    plan = make_plan(2, 2)
    reg = WorkerRegistration(plan)
    assert reg.gradients % PAGE_BYTES == 0 and reg.length % PAGE_BYTES == 0
    assert reg.gradients >= reg.elements * 4  # results and gradients do not overlap
    at = 0
    for c in plan.chunks:
        assert reg.result(c.id) == (at * 4, c.nbytes) and reg.gradient(c.id) == (reg.gradients + at * 4, c.nbytes)
        at += c.size
    for key, size in [("b0k0", 5000), ("b1k0", 33333)]:
        first, n = reg.key_elements(key)
        assert n == size and reg.result(plan.key_chunks(key)[0].id)[0] == first * 4
    with pytest.raises(ConfigError, match="chunk 999"):
        reg.result(999)


def test_per_batch_regions_start_at_their_batch():
    plan = make_plan(2, 2)
    second = WorkerRegistration(plan, batch=1)
    mine = [c for c in plan.chunks if c.batch == 1]
    assert sorted(second.position) == [c.id for c in mine] and second.result(mine[0].id) == (0, mine[0].nbytes)
    assert second.elements == 33333
    with pytest.raises(ConfigError, match="not among this region's"):
        second.result(0)  # a chunk of batch 0
    with pytest.raises(ConfigError, match="batch 2 has no chunks"):
        WorkerRegistration(plan, batch=2)
    for (server, core), lanes in core_lanes(plan).items():
        reg = CoreRegistration(plan, lanes, 3)
        for interface in reg.interfaces:
            blocks = reg.batch_blocks(interface, 1)
            assert blocks is not None and blocks.batch == 1 and reg.batch_blocks(interface, 7) is None
            first = blocks.chunk_ids[0]
            assert reg.in_batch_region(reg.slot(first, 0), first) == 0  # a batch's region starts with its slots
            assert reg.in_batch_region(reg.weights(first), first) == blocks.weights - blocks.slots


def test_registration_rejects_bad_ranks_and_lanes():
    plan = make_plan(1, 1)
    reg = CoreRegistration(plan, [0], 2)
    with pytest.raises(ConfigError, match="rank 2 is outside the job's 2 workers"):
        reg.slot(0, 2)
    with pytest.raises(ConfigError, match=r"lanes \[5\]"):
        CoreRegistration(plan, [0, 5], 2)
    with pytest.raises(ConfigError, match="4097 workers"):
        CoreRegistration(plan, [0], 4097)
