"""The aggregation state machine of one job on one server core, with no I/O.

The core owns the chunks whose lanes are pinned to it. For each owned chunk it keeps the weights,
the optimizer state, a merge buffer and one receive slot per worker. A push lands in the pushing
worker's slot (the transport writes it there directly, see `push_target`), then `on_push` folds it
into the merge buffer: the first copy waits in its slot, the second is added to it into the merge
buffer, later ones are added to that; the N-th copy is fused with the optimizer in one pass, and
the chunk is ready to go back to every worker. That is PHub's tall aggregation: one core sees
every copy of a chunk, so nothing is locked and nothing crosses cores.

Why the first copy can wait in its slot: a worker's next push of a chunk is for the next round,
which `push_target` refuses until this round is complete, so nothing overwrites the slot before
then. It saves a pass over the chunk (with two workers, the two slots go straight into the
optimizer's pass) and the float operations stay the same, in the same order: a + b, then + c...

Why one merge buffer is enough: a worker pushes chunk c of round k+1 only after it received
round k's result, and the result is rewritten only when all N copies of round k+1 arrived, i.e.
after every worker has its round-k result. In aggregation-only mode the result lives in its own
buffer for the same reason (the merge buffer is refilled while slower workers still read it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

import numpy as np

from ..protocol import wire
from .chunking import Chunk, ChunkPlan, Topology
from ..errors import ProtocolError
from .optim import Aggregate, Optimizer

# JobState.fast_table's columns, by chunk id: the chunk's lane here (-1: another core's), its
# payload bytes, and whether it is ready (1: its lane and batch are initialized). The C push loop
# reads them by these names (phub/network/fastpath_contract.py).
FAST_TABLE_COLUMNS = ("lane", "nbytes", "ready")
_LANE, _NBYTES, _READY = (FAST_TABLE_COLUMNS.index(name) for name in ("lane", "nbytes", "ready"))


class ChunkState:
    """Buffers and round bookkeeping of one owned chunk."""

    __slots__ = ("chunk", "rounds", "arrived", "mask", "weight", "weight_view", "mom", "acc",
                 "slots", "slot_views", "result", "result_view")

    def __init__(self, chunk: Chunk, weight: np.ndarray, acc: np.ndarray, slots: List[np.ndarray]):
        self.chunk = chunk
        self.rounds = 0  # completed rounds; the next push must carry iteration rounds + 1
        self.arrived = 0
        self.mask = 0  # bit r set: rank r's copy of this round has arrived
        self.weight = weight
        self.weight_view = memoryview(weight).cast("B")
        self.mom: Optional[np.ndarray] = None
        self.acc = acc
        self.slots = slots
        self.slot_views = [memoryview(s).cast("B") for s in slots]
        self.result: Optional[np.ndarray] = None
        self.result_view = self.weight_view

    def missing(self, num_workers: int) -> List[int]:
        return [r for r in range(num_workers) if not self.mask >> r & 1]


@dataclass(frozen=True)
class ReadyLane:
    """Event: a registered batch is initialized on this lane: send its chunks' weights, then READY."""

    lane: int
    batch: int
    chunks: Tuple[ChunkState, ...]


class Result(NamedTuple):
    """Event: a chunk's round is complete; send `state.result_view` to the lane's workers.
    (Immutable like the other events, but a named tuple: one is made per chunk and round.)"""

    state: ChunkState


class JobState:
    """One job's chunks on one core. Methods raise ProtocolError for anything a peer got wrong
    and return the events the transport must act on (lists of ReadyLane / Result / ...).

    Ranks here are the job's local worker indices 0..num_workers-1.
    """

    # A complete local round is the whole round: `_local_round_done` is `[finish_round(...)]`
    # (a rack's server overrides both), so a caller may call finish_round itself.
    finishes_rounds_here = True

    def __init__(self, job_id: int, num_workers: int, topology: Topology, chunk_bytes: int,
                 core: int, kernels, server: int = 0, total_workers: Optional[int] = None):
        self.job_id = job_id
        self.num_workers = num_workers
        self.total_workers = total_workers or num_workers  # over all racks (for averaging)
        self.core = core
        self.kernels = kernels
        self.plan = ChunkPlan(topology, chunk_bytes)
        self.lanes = set(topology.core_lanes(core, server))
        self.owned: Dict[int, ChunkState] = {}
        self.chunk_nbytes: List[int] = []
        self.optimizer: Dict[int, Optimizer] = {lane: Aggregate() for lane in self.lanes}
        self.loop_optimizers: Dict[int, Optional[tuple]] = {lane: None for lane in self.lanes}  # for the C loop
        self._registered: Dict[Tuple[int, int], Set[int]] = {}  # (lane, batch) -> ranks
        self._uninitialized: Dict[Tuple[int, int], Set[int]] = {}  # (lane, batch) -> chunk ids
        self._ready_sent: Set[Tuple[int, int]] = set()
        self._digests: List[str] = []
        # What the C push loop (phub/_fastpath.c, used by staged links) reads per chunk id: a row
        # of FAST_TABLE_COLUMNS, and the owned ChunkState by chunk id (None for another core's).
        self.fast_table = np.zeros((0, len(FAST_TABLE_COLUMNS)), dtype=np.int32)
        self.fast_states: List[Optional[ChunkState]] = []
        # Where a new batch's buffers live: None = the heap; the verbs data path sets a function
        # returning [(chunks, weights, slots[rank], results or None)] in registered memory.
        self.buffers = None

    # -- registration and initial weights ---------------------------------------------------
    def register(self, rank: int, lane: int, batch: int, arrays) -> list:
        """Rank `rank` registered batch `batch` (a list of [key, elements]) on `lane`."""
        try:
            arrays = [(key, int(n)) for key, n in arrays]
        except (TypeError, ValueError):
            raise ProtocolError(f"rank {rank} sent a malformed REGISTER for batch {batch}") from None
        if batch == len(self._digests):
            try:
                new = self.plan.add_arrays(arrays)
            except Exception as exc:  # ConfigError: empty batch, 0-d array, key twice
                raise ProtocolError(f"rank {rank} registered an invalid batch {batch}: {exc}") from None
            self._digests.append(ChunkPlan.batch_digest(arrays))
            self.chunk_nbytes = self.plan.chunk_nbytes()
            self._allocate([c for c in new if c.lane in self.lanes])
            self._extend_fast_table(new)
            for own_lane in self.lanes:
                self._uninitialized[(own_lane, batch)] = {c.id for c in new if c.lane == own_lane}
                self._registered[(own_lane, batch)] = set()
        elif not isinstance(batch, int) or batch > len(self._digests) or batch < 0:
            raise ProtocolError(f"rank {rank} registered batch {batch!r} before batch {len(self._digests)}")
        elif ChunkPlan.batch_digest(arrays) != self._digests[batch]:
            raise ProtocolError(f"rank {rank} registered different arrays than the other workers for batch {batch}")
        ranks = self._registered[(lane, batch)]
        if rank in ranks:
            raise ProtocolError(f"rank {rank} registered batch {batch} twice on lane {lane}")
        ranks.add(rank)
        return self._batch_progress(batch) + self._ready(lane, batch)

    def _allocate(self, chunks: List[Chunk]) -> None:
        groups = self.buffers(chunks) if self.buffers else [self._heap_buffers(chunks)]
        for group, weights, slots, results in groups:
            acc = np.zeros(len(weights), dtype=np.float32)
            offset = 0
            for c in group:
                end = offset + c.size
                state = self.owned[c.id] = ChunkState(c, weights[offset:end], acc[offset:end],
                                                      [slots[r, offset:end] for r in range(self.num_workers)])
                if results is not None:
                    state.result = results[offset:end]
                offset = end

    def _extend_fast_table(self, new: List[Chunk]) -> None:
        rows = np.zeros((len(new), len(FAST_TABLE_COLUMNS)), dtype=np.int32)
        for i, c in enumerate(new):
            rows[i, _LANE], rows[i, _NBYTES], rows[i, _READY] = c.lane if c.id in self.owned else -1, c.nbytes, 0
            self.fast_states.append(self.owned.get(c.id))
        self.fast_table = np.concatenate([self.fast_table, rows])

    def _heap_buffers(self, chunks: List[Chunk]):
        total = sum(c.size for c in chunks)
        slots = np.zeros((self.num_workers, total), dtype=np.float32)
        return chunks, np.zeros(total, dtype=np.float32), slots, None

    def owned_chunk(self, header: wire.Header, lane: Optional[int] = None) -> ChunkState:
        """The chunk a data frame is for, checked against the plan (and against `lane`, if given)."""
        wire.check_chunk(header, self.chunk_nbytes,
                         lambda cid: cid in self.owned and (lane is None or self.owned[cid].chunk.lane == lane))
        return self.owned[header.chunk]

    def state_target(self, rank: int, header: wire.Header, lane: int) -> memoryview:
        """Where the first worker's checkpointed optimizer state of a chunk goes: its momentum."""
        if rank != 0:
            raise ProtocolError(f"STATE frame from rank {header.sender}: only the first worker loads optimizer state")
        state = self.owned_chunk(header, lane)
        if (lane, state.chunk.batch) not in self._ready_sent:
            raise ProtocolError(f"rank {header.sender} loaded chunk {header.chunk}'s state before it was initialized")
        if state.mom is None:
            state.mom = np.zeros_like(state.weight)
        return memoryview(state.mom).cast("B")

    def lane_states(self, lane: int) -> List[ChunkState]:
        """The chunks of `lane` (all on this core), in chunk order."""
        return sorted((s for s in self.owned.values() if s.chunk.lane == lane), key=lambda s: s.chunk.id)

    def init_target(self, rank: int, header: wire.Header, lane: int) -> memoryview:
        """Where rank 0's initial weights of a chunk go: straight into the chunk's weights."""
        if rank != 0:
            raise ProtocolError(f"INIT frame from rank {header.sender}: only the first worker sets initial weights")
        state = self.owned_chunk(header, lane)
        if state.chunk.id not in self._uninitialized.get((lane, state.chunk.batch), ()):
            raise ProtocolError(f"chunk {state.chunk.id} was initialized twice")
        return state.weight_view

    def on_init(self, header: wire.Header, lane: int) -> list:
        state = self.owned[header.chunk]
        self._uninitialized[(lane, state.chunk.batch)].discard(state.chunk.id)
        return self._batch_progress(state.chunk.batch) + self._ready(lane, state.chunk.batch)

    def _lane_settled(self, lane: int, batch: int) -> bool:
        return not self._uninitialized[(lane, batch)] and len(self._registered[(lane, batch)]) == self.num_workers

    def _batch_progress(self, batch: int) -> list:
        """Hook: events once a batch is registered (and initialized) on every lane of this core."""
        return []

    def _peers_ready(self, batch: int) -> bool:
        """Hook: whether the other racks are ready for this batch (always, without racks)."""
        return True

    def _ready(self, lane: int, batch: int) -> list:
        if (lane, batch) in self._ready_sent or not self._lane_settled(lane, batch) or not self._peers_ready(batch):
            return []
        self._ready_sent.add((lane, batch))
        chunks = tuple(s for s in self.owned.values() if s.chunk.lane == lane and s.chunk.batch == batch)
        for state in chunks:
            self.fast_table[state.chunk.id, _READY] = 1
        return [ReadyLane(lane, batch, chunks)]

    def _ready_all(self, batch: int) -> list:
        return [event for lane in sorted(self.lanes) for event in self._ready(lane, batch)]

    # -- rounds ---------------------------------------------------------------------------
    def set_optimizer(self, lane: int, optimizer: Optimizer) -> None:
        """Rank 0's optimizer, applied to the chunks of `lane` in every round completed from now on.

        It is kept per lane because frames on one connection arrive in order: every chunk of a
        lane sees the optimizer rank 0 sent on that lane before its push, whatever other lanes do.
        """
        self.optimizer[lane] = optimizer
        self.loop_optimizers[lane] = optimizer.loop_params()

    def push_target(self, rank: int, header: wire.Header, lane: int) -> memoryview:
        """Where a pushed chunk goes: the sender's slot, after checking it belongs there now."""
        state = self.owned.get(header.chunk)  # owned_chunk's checks, inlined: this runs per frame
        if state is None or state.chunk.lane != lane or header.length != state.chunk.nbytes:
            state = self.owned_chunk(header, lane)  # raises, naming what is wrong
        if (lane, state.chunk.batch) not in self._ready_sent:
            raise ProtocolError(f"rank {header.sender} pushed chunk {header.chunk} before it was initialized")
        if header.iteration != state.rounds + 1:
            raise ProtocolError(f"rank {header.sender} pushed chunk {header.chunk} for iteration "
                                f"{header.iteration}, expected {state.rounds + 1}")
        if state.mask >> rank & 1:
            raise ProtocolError(f"rank {header.sender} pushed chunk {header.chunk} twice in iteration {header.iteration}")
        return state.slot_views[rank]

    def on_push(self, rank: int, header: wire.Header) -> list:
        """Fold a landed push into its chunk; return [Result] when the chunk's round is complete."""
        state = self.owned[header.chunk]
        before = state.mask
        state.mask = before | 1 << rank
        arrived = state.arrived = state.arrived + 1
        slots = state.slots
        if arrived == 2:  # the first copy is still in its slot (see the module docstring)
            first = slots[before.bit_length() - 1]
            if arrived == self.num_workers:
                return self._local_round_done(state, first, slots[rank])
            self.kernels.scale(state.acc, first, slots[rank], 1.0)  # acc = first + second (times 1: exact)
        elif arrived == self.num_workers:
            if arrived == 1:
                return self._local_round_done(state, slots[rank], None)
            return self._local_round_done(state, state.acc, slots[rank])
        elif arrived > 2:
            self.kernels.aggregate(state.acc, slots[rank], False)
        return []

    def _local_round_done(self, state: ChunkState, acc: np.ndarray, last: Optional[np.ndarray]) -> list:
        """Hook: every local worker's copy is in (their sum is acc + last). Without racks: finish."""
        return [self.finish_round(state, acc, last)]

    def finish_round(self, state: ChunkState, acc: np.ndarray, last: Optional[np.ndarray]) -> Result:
        """Run the lane's optimizer on the complete aggregate (acc + last) and close the round."""
        optimizer = self.optimizer[state.chunk.lane]
        if optimizer.needs_momentum and state.mom is None:
            state.mom = np.zeros_like(state.weight)
        if optimizer.returns_weights:
            state.result_view = state.weight_view
        else:
            if state.result is None:
                state.result = np.empty_like(state.weight)
            state.result_view = memoryview(state.result).cast("B")
        optimizer.apply(self.kernels, state.weight, state.mom, acc, last, state.result, self.total_workers)
        state.rounds += 1
        state.arrived = 0
        state.mask = 0
        return Result(state)

    def pending(self) -> List[ChunkState]:
        """Chunks part-way through a round (some workers' copies are missing)."""
        return [s for s in self.owned.values() if s.arrived]
