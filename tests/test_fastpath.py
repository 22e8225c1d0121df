"""The C receive loops (phub/_fastpath.c) and the staged links that feed them.

drain_pushes must leave a job's state exactly as the Python path (push_target + on_push) does,
bit for bit, and hand every frame it does not take in full back untouched; drain_results the same
for a worker's RESULTs. StagedLink must deliver every frame, however the bytes are cut.
"""
import selectors
import threading
import time

import numpy as np
import pytest

import phub
from phub.protocol import wire
from phub.reduction.aggregation import JobState
from phub.reduction.chunking import Topology
from phub.reduction.kernels import for_owned_buffers, get_backend
from phub.network.tcp import TcpServerPath
from phub.reduction.optim import NAG, SGD, Aggregate
from phub.network.links import StagedLink
from test_links import tcp_pair

fastpath = pytest.importorskip("phub._fastpath", reason="the C extension phub._fastpath is not built")

CHUNK_BYTES = 4096
SIZES = (5000, 20000, 300)  # elements: several chunks, and short last chunks


def ready_state(workers: int, core: int = 0, chunk_bytes: int = CHUNK_BYTES) -> JobState:
    kernels = for_owned_buffers(get_backend("fast"))  # as a server core has them
    state = JobState(0, workers, Topology(interfaces=2, cores=2), chunk_bytes, core, kernels)
    arrays = [[f"a{i}", n] for i, n in enumerate(SIZES)]
    for lane in sorted(state.lanes):
        for rank in range(workers):
            state.register(rank, lane, 0, arrays)
    for cid, chunk_state in state.owned.items():
        header = wire.Header(wire.Kind.INIT, 0, 0, cid, 0, chunk_state.chunk.nbytes)
        state.init_target(0, header, chunk_state.chunk.lane)[:] = np.full(chunk_state.chunk.size, 0.5, np.float32).tobytes()
        state.on_init(header, chunk_state.chunk.lane)
    for lane in state.lanes:
        state.set_optimizer(lane, NAG(learning_rate=0.1, momentum=0.9, rescale_grad=1.0 / workers))
    return state


def gradient(cid: int, size: int, rank: int, iteration: int) -> np.ndarray:
    rng = np.random.default_rng(cid * 1000 + rank * 10 + iteration)
    return rng.standard_normal(size).astype(np.float32)


def push_frame(cid: int, grad: np.ndarray, rank: int, iteration: int, kind=wire.Kind.PUSH, job=0) -> bytes:
    return wire.pack_header(kind, job, rank, cid, iteration, grad.nbytes) + grad.tobytes()


def drain(state: JobState, staging: bytearray, lane: int, rank: int, start: int = 0, end=None, job=0, parts=None):
    """drain_pushes on `staging`; with `parts` (a dict) it also finishes the rounds it can."""
    completed = []
    finishing = () if parts is None else (state.loop_optimizers, parts)
    offset, at_frame = fastpath.drain_pushes(staging, start, len(staging) if end is None else end, job, rank,
                                             lane, rank, state.num_workers, state.fast_table, state.fast_states,
                                             completed, *finishing)
    return offset, at_frame, completed


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 63, 64, 130])  # 64 and more: masks wider than 63 bits
def test_drain_pushes_leaves_the_state_the_python_path_leaves(workers):
    python, fast = ready_state(workers), ready_state(workers)
    for iteration in (1, 2, 3):
        for rank in range(workers):
            for lane in sorted(fast.lanes):
                chunks = [s for s in python.owned.values() if s.chunk.lane == lane]
                frames = bytearray()
                for s in chunks:
                    grad = gradient(s.chunk.id, s.chunk.size, rank, iteration)
                    header = wire.Header(wire.Kind.PUSH, 0, rank, s.chunk.id, iteration, grad.nbytes)
                    python.push_target(rank, header, lane)[:] = grad.tobytes()
                    python.on_push(rank, header)
                    frames += push_frame(s.chunk.id, grad, rank, iteration)
                offset, at_frame, completed = drain(fast, frames, lane, rank)
                assert (offset, at_frame) == (len(frames), False)
                assert len(completed) == (len(chunks) if rank == workers - 1 else 0)
                for chunk_state, acc, last in completed:
                    fast._local_round_done(chunk_state, acc, last)
    for cid, s in python.owned.items():
        f = fast.owned[cid]
        assert (f.rounds, f.arrived, f.mask) == (s.rounds, s.arrived, s.mask) == (3, 0, 0)
        assert f.weight.tobytes() == s.weight.tobytes() and f.mom.tobytes() == s.mom.tobytes()


@pytest.mark.parametrize("misalign", [0, 2])
def test_drain_pushes_reads_a_rounds_last_copy_where_it_landed(misalign):
    """The copy that completes a round is not copied into its slot: `last` views the staging
    buffer. A payload that is not float-aligned there (after a control frame of odd length) is
    copied as before."""
    python, fast = ready_state(2), ready_state(2)
    lane, s = first_chunk(fast)
    grads = [gradient(s.chunk.id, s.chunk.size, rank, 1) for rank in (0, 1)]
    for rank, grad in enumerate(grads):
        header = wire.Header(wire.Kind.PUSH, 0, rank, s.chunk.id, 1, grad.nbytes)
        python.push_target(rank, header, lane)[:] = grad.tobytes()
        python.on_push(rank, header)
    assert drain(fast, bytearray(push_frame(s.chunk.id, grads[0], 0, 1)), lane, 0)[2] == []
    buffer = bytearray(b"\0" * misalign + push_frame(s.chunk.id, grads[1], 1, 1))
    staging = memoryview(buffer)
    offset, at_frame, completed = drain(fast, staging, lane, 1, start=misalign)
    assert (offset, at_frame) == (len(buffer), False)
    [(chunk_state, acc, last)] = completed
    assert chunk_state is s and acc is s.slots[0]
    if misalign:
        assert last is s.slots[1] and s.slots[1].tobytes() == grads[1].tobytes()
    else:
        assert isinstance(last, memoryview) and last.obj is buffer and bytes(last) == grads[1].tobytes()
        assert not s.slots[1].any()  # never written
    fast._local_round_done(chunk_state, acc, last)
    assert s.weight.tobytes() == python.owned[s.chunk.id].weight.tobytes()
    assert s.mom.tobytes() == python.owned[s.chunk.id].mom.tobytes()


class Recorder:
    """A link that keeps what it is asked to send, as bytes."""

    def __init__(self):
        self.sent = bytearray()  # a stream: how the bytes are cut into parts is the sender's choice

    def send(self, *parts):
        for part in parts:
            self.sent += part


OPTIMIZERS = {
    "nag": NAG(learning_rate=0.1, momentum=0.9, rescale_grad=0.5),
    "nag, wd and clipping": NAG(learning_rate=0.05, momentum=0.5, wd=0.01, rescale_grad=1.0, clip_gradient=0.3),
    "sgd with momentum": SGD(learning_rate=0.1, momentum=0.9, wd=0.001, rescale_grad=0.5),
    "sgd": SGD(learning_rate=0.1),
    "aggregate (left to Python)": Aggregate(average=True),
}


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
@pytest.mark.parametrize("chunk_bytes", [1024, 4 * CHUNK_BYTES], ids=["copied results", "mixed"])
@pytest.mark.parametrize("misalign", [0, 2])
def test_drain_pushes_finishes_rounds_as_the_python_path_does(workers, optimizer, chunk_bytes, misalign):
    """Weights, momentum, round bookkeeping and the RESULT frames sent, byte for byte; the first
    round of a chunk (momentum not yet allocated), an optimizer the loop does not run and a last
    copy that is not float-aligned in the staging buffer (behind `misalign` bytes) are handed
    back, and the Python path finishes those. Chunks of up to 2 KB go out as copies, larger ones
    from the weights: with 16 KB chunks the keys' short last chunks mix the two."""
    python, fast = ready_state(workers, chunk_bytes=chunk_bytes), ready_state(workers, chunk_bytes=chunk_bytes)
    lane = min(fast.lanes)
    for state in (python, fast):
        state.set_optimizer(lane, optimizer)
    links = {"python": [Recorder() for _ in range(workers)], "fast": [Recorder() for _ in range(workers)]}
    chunks = [s for s in fast.owned.values() if s.chunk.lane == lane]
    for iteration in (1, 2, 3):
        parts, completed = {}, []
        for rank in range(workers):
            frames = bytearray(b"\0" * misalign)
            for s in chunks:
                grad = gradient(s.chunk.id, s.chunk.size, rank, iteration)
                header = wire.Header(wire.Kind.PUSH, 0, rank, s.chunk.id, iteration, grad.nbytes)
                python.push_target(rank, header, lane)[:] = grad.tobytes()
                for event in python.on_push(rank, header):
                    TcpServerPath(0).send_result(event.state, links["python"])
                frames += push_frame(s.chunk.id, grad, rank, iteration)
            offset, at_frame, handed_back = drain(fast, memoryview(frames), lane, rank, start=misalign, parts=parts)
            assert (offset, at_frame) == (len(frames), False)
            for chunk_state, acc, last in handed_back:  # before the staging buffer is reused
                completed.append((chunk_state, np.array(acc), None if last is None else np.array(last)))
        in_python = iteration == 1 and optimizer.needs_momentum or optimizer.loop_params() is None or misalign
        assert len(completed) == (len(chunks) if in_python else 0)
        assert not parts if in_python else list(parts) == [lane]
        TcpServerPath(0).send_result_frames(parts, {lane: links["fast"]})
        for chunk_state, acc, last in completed:
            fast.finish_round(chunk_state, acc, last)
            TcpServerPath(0).send_result(chunk_state, links["fast"])
    assert [link.sent for link in links["fast"]] == [link.sent for link in links["python"]]
    for s in chunks:
        p = python.owned[s.chunk.id]
        assert (s.rounds, s.arrived, s.mask) == (p.rounds, p.arrived, p.mask) == (3, 0, 0)
        assert s.weight.tobytes() == p.weight.tobytes()
        assert (s.mom is None) == (p.mom is None) and (s.mom is None or s.mom.tobytes() == p.mom.tobytes())


def test_drain_pushes_wants_both_or_neither_of_optimizers_and_parts():
    state = ready_state(2)
    lane, s = first_chunk(state)
    frame = bytearray(push_frame(s.chunk.id, gradient(s.chunk.id, s.chunk.size, 0, 1), 0, 1))
    with pytest.raises(TypeError, match="both be dicts"):
        fastpath.drain_pushes(frame, 0, len(frame), 0, 0, lane, 0, 2, state.fast_table, state.fast_states, [],
                              state.loop_optimizers, None)
    assert (s.rounds, s.arrived, s.mask) == (0, 0, 0)  # refused before anything was read


def first_chunk(state: JobState):
    lane = min(state.lanes)
    return lane, next(s for s in state.owned.values() if s.chunk.lane == lane)


def other_core_chunk(state: JobState) -> int:
    return next(cid for cid in range(len(state.fast_states)) if state.fast_states[cid] is None)


BAD_PUSHES = {
    "another kind": lambda s, cid, g: push_frame(cid, g, 0, 1, kind=wire.Kind.INIT),
    "another job": lambda s, cid, g: push_frame(cid, g, 0, 1, job=7),
    "another sender": lambda s, cid, g: push_frame(cid, g, 1, 1),
    "a chunk of another core": lambda s, cid, g: push_frame(other_core_chunk(s), g, 0, 1),
    "a chunk outside the plan": lambda s, cid, g: push_frame(10**6, g, 0, 1),
    "a wrong length": lambda s, cid, g: push_frame(cid, g[:-1], 0, 1),
    "a future iteration": lambda s, cid, g: push_frame(cid, g, 0, 2),
    "a past iteration": lambda s, cid, g: push_frame(cid, g, 0, 0),
    "bad magic": lambda s, cid, g: b"XHUB" + push_frame(cid, g, 0, 1)[4:],
}


@pytest.mark.parametrize("make", BAD_PUSHES.values(), ids=BAD_PUSHES.keys())
def test_drain_pushes_hands_back_what_it_does_not_take(make):
    state = ready_state(2)
    lane, s = first_chunk(state)
    good = push_frame(s.chunk.id, gradient(s.chunk.id, s.chunk.size, 0, 1), 0, 1)
    frames = bytearray(good + make(state, s.chunk.id, gradient(s.chunk.id, s.chunk.size, 0, 1)))
    offset, at_frame, completed = drain(state, frames, lane, 0)
    assert (offset, at_frame, completed) == (len(good), True, [])
    assert (s.arrived, s.mask) == (1, 0b01)  # the good push only


def test_drain_pushes_hands_back_a_second_push_of_a_round_and_a_chunk_not_yet_ready():
    state = ready_state(2)
    lane, s = first_chunk(state)
    grad = gradient(s.chunk.id, s.chunk.size, 0, 1)
    frames = bytearray(push_frame(s.chunk.id, grad, 0, 1) * 2)
    assert drain(state, frames, lane, 0)[:2] == (len(frames) // 2, True)
    state.fast_table[s.chunk.id, 2] = 0  # as before its READY
    assert drain(state, bytearray(push_frame(s.chunk.id, grad, 1, 1)), lane, 1)[:2] == (0, True)


def test_drain_pushes_waits_for_the_rest_of_a_frame():
    state = ready_state(2)
    lane, s = first_chunk(state)
    frame = push_frame(s.chunk.id, gradient(s.chunk.id, s.chunk.size, 0, 1), 0, 1)
    for cut in (0, 10, wire.HEADER_BYTES, len(frame) - 1):
        assert drain(state, bytearray(frame), lane, 0, end=cut)[:2] == (0, False)
        assert s.arrived == 0
    assert drain(state, bytearray(b"\0" * 8 + frame), lane, 0, start=8)[:2] == (8 + len(frame), False)


class Counter:
    """A handle double: counts what it is told arrived, and how often it was told."""

    def __init__(self, n):
        self.left, self.told = n, 0

    def _arrived(self, count=1):
        self.left -= count
        self.told += 1


def test_drain_results_copies_expected_results_and_hands_back_the_rest():
    table = np.array([[0, 16], [1, 16], [0, 8]], dtype=np.int32)
    out = np.zeros(10, np.float32)
    view = memoryview(out).cast("B")
    handle = Counter(2)
    expect = {0: (view[0:16], [4, handle]), 2: (view[16:24], [4, handle]), 1: (view[24:40], [4, handle])}

    def result(cid, values, iteration=4):
        data = np.asarray(values, np.float32).tobytes()
        return wire.pack_header(wire.Kind.RESULT, 0, wire.SERVER_SENDER, cid, iteration, len(data)) + data

    good = result(0, [1, 2, 3, 4]) + result(2, [5, 6])
    for bad in (result(1, [7, 8, 9, 10]),  # lane 1's chunk on lane 0's connection
                result(0, [1, 2, 3, 4]),  # no longer expected
                result(2, [5, 6], iteration=5)):
        out[:] = 0
        expect.update({0: (view[0:16], [4, handle]), 2: (view[16:24], [4, handle])})
        handle.left, handle.told = 2, 0
        staging = bytearray(good + bad)
        assert fastpath.drain_results(staging, 0, len(staging), 0, 0, table, expect) == (len(good), True)
        assert out[:6].tolist() == [1, 2, 3, 4, 5, 6] and handle.left == 0 and set(expect) == {1}
        assert handle.told == 1  # one pushpull's results, told at once


def test_drain_results_tells_each_handle_every_result_of_it_in_order_of_runs():
    """Results are counted in per run of one handle: interleaved pushpulls are each told all of
    theirs, and a handle is told before the loop hands a frame back."""
    table = np.array([[0, 4]] * 5, dtype=np.int32)
    out = np.zeros(5, np.float32)
    view = memoryview(out).cast("B")
    first, second = Counter(3), Counter(2)
    owner = {0: first, 1: second, 2: first, 3: first, 4: second}
    expect = {cid: (view[4 * cid:4 * cid + 4], [1, handle]) for cid, handle in owner.items()}

    def result(cid):
        return wire.pack_header(wire.Kind.RESULT, 0, wire.SERVER_SENDER, cid, 1, 4) + np.float32(cid + 1).tobytes()

    frames = b"".join(result(cid) for cid in range(4))
    staging = bytearray(frames + result(4)[:20])  # the last result cut short: it waits
    assert fastpath.drain_results(staging, 0, len(staging), 0, 0, table, expect) == (len(frames), False)
    assert (first.left, first.told, second.left, second.told) == (0, 2, 1, 1)  # runs: 0 | 1 | 2, 3
    assert out.tolist() == [1, 2, 3, 4, 0] and set(expect) == {4}


@pytest.mark.parametrize("offset", [0, 4, 8, 12])
@pytest.mark.parametrize("nbytes", [4092, 4096, 4100, 8196, 65536])
def test_drain_results_copies_every_byte_whatever_the_size_and_alignment(nbytes, offset):
    """Exactly the payload lands in the caller's array, whatever its size and alignment, and
    nothing beside it."""
    table = np.array([[0, nbytes]], dtype=np.int32)
    out = np.full((offset + nbytes) // 4 + 2, -1.0, np.float32)
    view = memoryview(out).cast("B")
    values = np.arange(nbytes // 4, dtype=np.float32) + 0.5
    handle = Counter(1)
    expect = {0: (view[offset:offset + nbytes], [1, handle])}
    staging = bytearray(b"\0" * 3 + wire.pack_header(wire.Kind.RESULT, 0, wire.SERVER_SENDER, 0, 1, nbytes)
                        + values.tobytes())  # a payload at an odd place in the staging buffer
    assert fastpath.drain_results(staging, 3, len(staging), 0, 0, table, expect) == (len(staging), False)
    assert handle.left == 0 and expect == {}
    assert bytes(view[offset:offset + nbytes]) == values.tobytes()
    assert (out[:offset // 4] == -1).all() and (out[(offset + nbytes) // 4:] == -1).all()


@pytest.mark.parametrize("pieces", [7, 4096, 100_000], ids=lambda n: f"{n}-byte pieces")
def test_a_staged_link_delivers_every_frame_however_the_bytes_are_cut(pieces):
    """Control frames, pushes the C loop takes, and a control frame larger than the staging buffer."""
    state = ready_state(2)
    lane, s = first_chunk(state)
    frames = [wire.control_frame(wire.Kind.HELLO, 0, 0, {"n": 1}),
              push_frame(s.chunk.id, gradient(s.chunk.id, s.chunk.size, 0, 1), 0, 1),
              wire.control_frame(wire.Kind.REGISTER, 0, 0, {"pad": "x" * 300_000}),
              wire.control_frame(wire.Kind.BYE, 0, 0, {})]
    stream = b"".join(frames)
    selector, got, taken = selectors.DefaultSelector(), [], []

    def fast(link, staging, start, end):
        offset, at_frame, completed = drain(state, staging, lane, 0, start, end)
        taken.append(offset - start)
        return offset, at_frame

    def no_data(header):
        raise AssertionError(f"the {header.kind.name} frame should have been taken by the C loop")

    a, b = tcp_pair()
    link = StagedLink(b, selector, no_data, lambda _, frame: got.append(frame), None, fast, 2 * (CHUNK_BYTES + 32))
    sender = threading.Thread(target=lambda: [a.sendall(stream[i:i + pieces]) for i in range(0, len(stream), pieces)])
    try:
        sender.start()
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                link.on_readable()
        assert [f.header.kind for f in got] == [wire.Kind.HELLO, wire.Kind.REGISTER, wire.Kind.BYE]
        assert len(got[1].payload) == len(frames[2]) - wire.HEADER_BYTES
        assert sum(taken) == len(frames[1]) and (s.arrived, s.mask) == (1, 0b01)
    finally:
        sender.join(30)
        link.close()
        a.close()


WIDE_JOB = """
import sys, threading
import numpy as np
import phub

workers, size, steps = 128, 3000, 2
server = phub.Server(phub.ServerConfig(jobs=(phub.JobSpec(0, workers),), interfaces=("127.0.0.1",), once=True,
                                       timeout=60, chunk_bytes=4096)).start()
pattern = (np.arange(size) % 7).astype(np.float32)
outcomes = [None] * workers


def worker(rank):
    try:
        with phub.Client(server.address, rank, workers, timeout=60) as kv:
            kv.init("w", np.zeros(size, np.float32))
            outcomes[rank] = [kv.pushpull("w", pattern + rank).copy() for _ in range(steps)]
    except Exception as exc:  # reported below, by rank
        outcomes[rank] = exc


threads = [threading.Thread(target=worker, args=(rank,)) for rank in range(workers)]
try:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    status = server.wait(timeout=30)
finally:
    server.stop()
expected = (workers * pattern + workers * (workers - 1) / 2).astype(np.float32)
for rank, outcome in enumerate(outcomes):
    if isinstance(outcome, Exception) or outcome is None:
        sys.exit(f"rank {rank}: {outcome!r}")
    if any(result.tobytes() != expected.tobytes() for result in outcome):
        sys.exit(f"rank {rank}: not the exact sum")
print(f"exact sum, server status {status}")
"""


def test_a_job_of_128_workers_gets_the_exact_sum_through_the_c_loop():
    """The configuration allows thousands of workers and the paper's PBox serves about 120: a
    job wider than the C loop's 63-bit arrival masks must run on it too. 128 workers, each a
    client in a thread, push rank + (i mod 7); the sum is exact in float32. The job runs in a
    process of its own: a server forked from a process with 128 threads in it (this one, for
    the tests after it) could inherit a lock one of them held."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WIDE_JOB], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "exact sum, server status 0" in done.stdout, done.stdout + done.stderr[-3000:]
