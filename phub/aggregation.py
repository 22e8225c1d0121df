"""The aggregation state machine of one job on one server core, with no I/O.

The core owns the chunks whose lanes are pinned to it. For each owned chunk it keeps the weights,
the optimizer state, a merge buffer and one receive slot per worker. A push lands in the pushing
worker's slot (the transport writes it there directly, see `push_target`), then `on_push` folds it
into the merge buffer: the first copy is copied, later ones are added; the N-th copy is fused with
the optimizer in one pass, and the chunk is ready to go back to every worker. That is PHub's tall
aggregation: one core sees every copy of a chunk, so nothing is locked and nothing crosses cores.

Why one merge buffer is enough: a worker pushes chunk c of round k+1 only after it received
round k's result, and the result is rewritten only when all N copies of round k+1 arrived, i.e.
after every worker has its round-k result. In aggregation-only mode the result lives in its own
buffer for the same reason (the merge buffer is refilled while slower workers still read it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from . import wire
from .chunking import Chunk, ChunkPlan, Topology
from .errors import ProtocolError
from .optim import Aggregate, Optimizer


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
    """A registered batch is initialized on this lane: send its chunks' weights, then READY."""

    lane: int
    batch: int
    chunks: Tuple[ChunkState, ...]


class JobState:
    """One job's chunks on one core. Methods raise ProtocolError for anything a peer got wrong."""

    def __init__(self, job_id: int, num_workers: int, topology: Topology, chunk_bytes: int,
                 core: int, kernels):
        self.job_id = job_id
        self.num_workers = num_workers
        self.core = core
        self.kernels = kernels
        self.plan = ChunkPlan(topology, chunk_bytes)
        self.lanes = set(topology.core_lanes(core))
        self.owned: Dict[int, ChunkState] = {}
        self.chunk_nbytes: List[int] = []
        self.optimizer: Dict[int, Optimizer] = {lane: Aggregate() for lane in self.lanes}
        self._registered: Dict[Tuple[int, int], Set[int]] = {}  # (lane, batch) -> ranks
        self._uninitialized: Dict[Tuple[int, int], Set[int]] = {}  # (lane, batch) -> chunk ids
        self._digests: List[str] = []

    # -- registration and initial weights ---------------------------------------------------
    def register(self, rank: int, lane: int, batch: int, arrays) -> Optional[ReadyLane]:
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
            for own_lane in self.lanes:
                self._uninitialized[(own_lane, batch)] = {c.id for c in new if c.lane == own_lane}
                self._registered[(own_lane, batch)] = set()
        elif batch > len(self._digests) or batch < 0:
            raise ProtocolError(f"rank {rank} registered batch {batch} before batch {len(self._digests)}")
        elif ChunkPlan.batch_digest(arrays) != self._digests[batch]:
            raise ProtocolError(f"rank {rank} registered different arrays than the other workers for batch {batch}")
        ranks = self._registered[(lane, batch)]
        if rank in ranks:
            raise ProtocolError(f"rank {rank} registered batch {batch} twice on lane {lane}")
        ranks.add(rank)
        return self._ready(lane, batch)

    def _allocate(self, chunks: List[Chunk]) -> None:
        total = sum(c.size for c in chunks)
        weights = np.zeros(total, dtype=np.float32)
        acc = np.zeros(total, dtype=np.float32)
        slots = np.zeros((self.num_workers, total), dtype=np.float32)
        offset = 0
        for c in chunks:
            end = offset + c.size
            self.owned[c.id] = ChunkState(c, weights[offset:end], acc[offset:end],
                                          [slots[r, offset:end] for r in range(self.num_workers)])
            offset = end

    def _owned_on(self, header: wire.Header, lane: int) -> ChunkState:
        wire.check_chunk(header, self.chunk_nbytes,
                         lambda cid: cid in self.owned and self.owned[cid].chunk.lane == lane)
        return self.owned[header.chunk]

    def init_target(self, header: wire.Header, lane: int) -> memoryview:
        """Where rank 0's initial weights of a chunk go: straight into the chunk's weights."""
        if header.sender != 0:
            raise ProtocolError(f"INIT frame from rank {header.sender}: only rank 0 sets initial weights")
        state = self._owned_on(header, lane)
        if state.chunk.id not in self._uninitialized.get((lane, state.chunk.batch), ()):
            raise ProtocolError(f"chunk {state.chunk.id} was initialized twice")
        return state.weight_view

    def on_init(self, header: wire.Header, lane: int) -> Optional[ReadyLane]:
        state = self.owned[header.chunk]
        self._uninitialized[(lane, state.chunk.batch)].discard(state.chunk.id)
        return self._ready(lane, state.chunk.batch)

    def _ready(self, lane: int, batch: int) -> Optional[ReadyLane]:
        if self._uninitialized[(lane, batch)] or len(self._registered[(lane, batch)]) < self.num_workers:
            return None
        chunks = tuple(s for s in self.owned.values() if s.chunk.lane == lane and s.chunk.batch == batch)
        self._uninitialized[(lane, batch)] = {-1}  # READY is sent once
        return ReadyLane(lane, batch, chunks)

    # -- rounds ---------------------------------------------------------------------------
    def set_optimizer(self, lane: int, optimizer: Optimizer) -> None:
        """Rank 0's optimizer, applied to the chunks of `lane` from their next round on.

        It is kept per lane because frames on one connection arrive in order: every chunk of a
        lane sees the optimizer rank 0 sent on that lane before its push, whatever other lanes do.
        """
        self.optimizer[lane] = optimizer

    def push_target(self, header: wire.Header, lane: int) -> memoryview:
        """Where a pushed chunk goes: the sender's slot, after checking it belongs there now."""
        state = self._owned_on(header, lane)
        if state.chunk.id in self._uninitialized.get((lane, state.chunk.batch), ()):
            raise ProtocolError(f"rank {header.sender} pushed chunk {header.chunk} before it was initialized")
        if header.iteration != state.rounds + 1:
            raise ProtocolError(f"rank {header.sender} pushed chunk {header.chunk} for iteration "
                                f"{header.iteration}, expected {state.rounds + 1}")
        if state.mask >> header.sender & 1:
            raise ProtocolError(f"rank {header.sender} pushed chunk {header.chunk} twice in iteration {header.iteration}")
        return state.slot_views[header.sender]

    def on_push(self, header: wire.Header) -> Optional[ChunkState]:
        """Fold a landed push into its chunk; return the chunk when its round is complete."""
        state = self.owned[header.chunk]
        rank = header.sender
        state.mask |= 1 << rank
        state.arrived += 1
        if state.arrived < self.num_workers:
            self.kernels.aggregate(state.acc, state.slots[rank], state.arrived == 1)
            return None
        acc, last = (state.acc, state.slots[rank]) if self.num_workers > 1 else (state.slots[rank], None)
        optimizer = self.optimizer[state.chunk.lane]
        if optimizer.needs_momentum and state.mom is None:
            state.mom = np.zeros_like(state.weight)
        if optimizer.returns_weights:
            state.result_view = state.weight_view
        elif state.result is None:
            state.result = np.empty_like(state.weight)
            state.result_view = memoryview(state.result).cast("B")
        else:
            state.result_view = memoryview(state.result).cast("B")
        optimizer.apply(self.kernels, state.weight, state.mom, acc, last, state.result, self.num_workers)
        state.rounds += 1
        state.arrived = 0
        state.mask = 0
        return state

    def pending(self) -> List[ChunkState]:
        """Chunks part-way through a round (some workers' copies are missing)."""
        return [s for s in self.owned.values() if s.arrived]
