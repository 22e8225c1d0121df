"""The C rack loops (phub/_fastpath_racks.h): rack_rounds_done and drain_rack_frames must leave
every rack's weights, results and round state exactly as the Python path (test_hierarchy's bus of
HierarchicalJobState machines) does, bit for bit, with several cores and interfaces per PBox, and
leave to the Python path, untouched, every frame they do not take in full."""
import numpy as np
import pytest

from phub.protocol import wire
from phub.reduction.optim import NAG, SGD
from test_hierarchy import SHAPE, Racks, expected, gradient

fastpath = pytest.importorskip("phub._fastpath", reason="the C extension phub._fastpath is not built")
K = wire.Kind


def frames_in(buffer) -> list:
    """(kind, chunk, iteration, payload bytes) of each whole frame in `buffer`."""
    frames, at = [], 0
    while at < len(buffer):
        h = wire.decode_header(bytes(buffer[at:at + wire.HEADER_BYTES]))
        payload = bytes(buffer[at + wire.HEADER_BYTES:at + wire.HEADER_BYTES + h.length])
        frames.append((h, payload))
        at += wire.HEADER_BYTES + h.length
    return frames


def float_gradient(cid, size, rack, rank, iteration):
    """Values whose float32 sums depend on their order (test_hierarchy's are small integers)."""
    return np.random.default_rng([cid, rack, rank, iteration]).standard_normal(size).astype(np.float32)


class PythonRacks(Racks):
    """test_hierarchy's bus, pushing `gradient`'s values."""

    def __init__(self, racks, optimizer, seed=0, gradient=gradient):
        super().__init__(racks, seed=seed)
        self.optimizer, self.gradient = optimizer, gradient

    def register_and_init(self):
        super().register_and_init()
        for cores in self.states:
            for state in cores:
                for lane in state.lanes:
                    state.set_optimizer(lane, self.optimizer)

    def push(self, rack, core, cid, rank, iteration):
        state = self.states[rack][core]
        chunk = state.owned[cid].chunk
        h = wire.Header(K.PUSH, 0, rank, cid, iteration, chunk.nbytes)
        state.push_target(rank, h, chunk.lane)[:] = self.gradient(cid, chunk.size, rack, rank, iteration).tobytes()
        self.act(rack, core, state.on_push(rank, h))


class CRacks(PythonRacks):
    """The bus of test_hierarchy with each rack's pushes and rack frames taken by the C loops, as
    a server core's staged links take them (protocol/core.py, fast_pushes)."""

    def __init__(self, racks, optimizer, seed=0, gradient=gradient):
        super().__init__(racks, optimizer, seed, gradient)
        self.in_c = 0  # data frames the C loops took

    def queued(self, rack, core, interface, results, out, handed_back):
        """What a core sends for what the C loops queued (CoreProtocol._rack_rounds_sent)."""
        state = self.states[rack][core]
        for parts in results.values():
            for part in parts:
                for h, payload in frames_in(part):
                    assert h.kind is K.RESULT and h.iteration == state.owned[h.chunk].rounds
                    self.results[rack][h.chunk] = np.frombuffer(payload, np.float32).copy()
        for to, frames in out.items():
            for h, payload in frames_in(frames):
                assert h.sender == rack and state.interface_of(h.chunk) == interface
                self.send(rack, to, core, interface, h.kind, h.chunk, h.iteration, payload)
        for chunk_state, total in handed_back:
            self.act(rack, core, [state.finish_round(chunk_state, total, None)])

    def tables(self, state):
        return (state.fast_table, state.rack_table, state.rack_rows, state.fast_states, state.loop_optimizers)

    def push(self, rack, core, cid, rank, iteration):
        state = self.states[rack][core]
        chunk = state.owned[cid].chunk
        grad = self.gradient(cid, chunk.size, rack, rank, iteration)
        frame = bytearray(wire.pack_header(K.PUSH, 0, rank, cid, iteration, chunk.nbytes) + grad.tobytes())
        local = []
        offset, at_frame = fastpath.drain_pushes(frame, 0, len(frame), 0, rank, chunk.lane, rank, state.num_workers,
                                                 state.fast_table, state.fast_states, local)
        assert (offset, at_frame) == (len(frame), False)
        results, out, handed_back = {}, {}, []
        fastpath.rack_rounds_done(local, 0, rack, self.racks, *self.tables(state), results, out, handed_back)
        self.queued(rack, core, state.interface_of(cid), results, out, handed_back)

    def deliver(self, link):
        rack, to, core, interface = link
        kind = self.links[link][0][0]
        if kind not in (K.PARTIAL, K.TOTAL):
            return super().deliver(link)
        kind, cid, iteration, payload = self.links[link].popleft()
        state = self.states[to][core]
        frame = bytearray(wire.pack_header(kind, 0, rack, cid, iteration, len(payload)) + payload)
        results, out, handed_back = {}, {}, []
        offset, at_frame = fastpath.drain_rack_frames(frame, 0, len(frame), 0, to, rack, self.racks, interface,
                                                      *self.tables(state), results, out, handed_back)
        assert (offset, at_frame) == (len(frame), False), (kind, cid, iteration)
        self.in_c += 1
        self.queued(to, core, interface, results, out, handed_back)


OPTIMIZERS = {"sgd": SGD(learning_rate=0.5),  # first rounds finished in C too
              "nag": NAG(learning_rate=0.1, momentum=0.9, rescale_grad=0.25)}  # first rounds handed back


@pytest.mark.parametrize("racks, seed", [(2, 0), (3, 1), (4, 2)])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("values", ["integers", "floats"])
def test_the_c_loops_leave_every_rack_as_the_python_path_does(racks, seed, optimizer, values):
    grads = gradient if values == "integers" else float_gradient
    python = PythonRacks(racks, OPTIMIZERS[optimizer], seed, grads)
    fast = CRacks(racks, OPTIMIZERS[optimizer], seed, grads)
    python.register_and_init()
    fast.register_and_init()
    for iteration in (1, 2, 3):
        python.run_round(iteration)
        fast.run_round(iteration)
        for rack in range(racks):
            assert fast.results[rack].keys() == python.results[rack].keys()
            for cid, result in python.results[rack].items():
                assert fast.results[rack][cid].tobytes() == result.tobytes(), (rack, cid, iteration)
            for core in range(SHAPE.cores):
                mine, theirs = fast.states[rack][core], python.states[rack][core]
                np.testing.assert_array_equal(mine.rack_table, theirs.rack_table)
                for cid, state in theirs.owned.items():
                    other = mine.owned[cid]
                    assert (other.rounds, other.arrived, other.mask) == (state.rounds, state.arrived, state.mask)
                    assert other.weight.tobytes() == state.weight.tobytes()
                    assert other.weight.tobytes() == fast.states[0][core].owned[cid].weight.tobytes()
                    if optimizer == "sgd" and values == "integers":
                        np.testing.assert_array_equal(other.weight, expected(state.chunk.size, racks, iteration))
    model_chunks = sum(len(s.owned) for s in fast.states[0])
    assert fast.in_c == 3 * model_chunks * 2 * (racks - 1)  # every partial and every total, each round


def test_what_the_c_loop_does_not_take_is_left_untouched_for_python():
    bus = CRacks(3, OPTIMIZERS["sgd"], seed=4)
    bus.register_and_init()
    core = 0
    states = [bus.states[r][core] for r in range(3)]
    cid = bus.chunk_ids(core)[0]
    owner = states[0].owner[cid]
    other, third = [r for r in range(3) if r != owner]
    chunk = states[0].owned[cid].chunk
    interface = states[0].interface_of(cid)
    payload = np.ones(chunk.size, np.float32).tobytes()

    def left_alone(to, sender, frame, link_interface=interface):
        state = states[to]
        before = (state.rack_table.copy(), [r.copy() for r in state.rack_rows if r is not None])
        results, out, handed_back = {}, {}, []
        offset, at_frame = fastpath.drain_rack_frames(frame, 0, len(frame), 0, to, sender, 3, link_interface,
                                                      *bus.tables(state), results, out, handed_back)
        assert (offset, at_frame) == (0, True)
        assert (results, out, handed_back) == ({}, {}, [])
        np.testing.assert_array_equal(state.rack_table, before[0])
        assert all(a.tobytes() == b.tobytes() for a, b in zip(before[1], (r for r in state.rack_rows if r is not None)))

    def frame(kind, sender, iteration=1, chunk_id=cid, job=0, nbytes=chunk.nbytes):
        return bytearray(wire.pack_header(kind, job, sender, chunk_id, iteration, nbytes) + payload[:nbytes])

    left_alone(third, other, frame(K.PARTIAL, other))  # not the owner
    left_alone(owner, other, frame(K.PARTIAL, other), 1 - interface)  # another interface's link
    left_alone(owner, other, frame(K.PARTIAL, other, iteration=3))  # out of turn
    left_alone(owner, other, frame(K.PARTIAL, third))  # the header's sender is not the link's rack
    left_alone(owner, other, frame(K.PARTIAL, other, job=7))
    left_alone(owner, other, frame(K.PARTIAL, other, nbytes=chunk.nbytes - 4))
    left_alone(other, owner, frame(K.TOTAL, owner))  # before this rack sent its partial
    left_alone(owner, other, frame(K.PUSH, other))  # another kind
    left_alone(owner, other, bytearray(wire.control_frame(K.BYE, 0, other, {})))
    # in turn, the same frame is taken; twice, the second is left to Python (which refuses it)
    twice = frame(K.PARTIAL, other) * 2
    results, out, handed_back = {}, {}, []
    offset, at_frame = fastpath.drain_rack_frames(twice, 0, len(twice), 0, owner, other, 3, interface,
                                                  *bus.tables(states[owner]), results, out, handed_back)
    assert (offset, at_frame) == (len(twice) // 2, True)
    assert states[owner].arrived_bits(cid) == 1 << other
