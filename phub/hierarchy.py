"""Two-phase (hierarchical) reduction across racks, with no I/O.

Each rack has its own server (a PBox). Phase one is the ordinary tall aggregation of the rack's
workers. Phase two: the rack's aggregate of a chunk (its *partial*) goes to every other rack's
server, over the core network, and each server adds all racks' partials **in rack order**, then
runs the optimizer. Every server does the same float32 operations on the same bytes, so every
rack ends with bit-identical weights; rack 0's initial weights are copied to the other racks
before training starts so that they also start identical.

The same core index serves the same chunks in every rack (the racks' servers have the same
shape), so core c of rack r only talks to core c of the other racks.

Why two partial buffers per rack (by round parity): a rack can be at most one round ahead of
another. Its round k+1 partial may arrive while this server still waits for a third rack's round
k partial, and must not overwrite the round k partial it already holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from . import wire
from .aggregation import ChunkState, JobState
from .chunking import Chunk
from .errors import ProtocolError


@dataclass(frozen=True)
class SendPartial:
    """Event: send this rack's partial of a chunk (round `iteration`) to every other rack."""

    state: ChunkState
    iteration: int
    view: memoryview


@dataclass(frozen=True)
class SendPeerInit:
    """Event (rack 0 only): send these chunks' initial weights to rack `rack`."""

    rack: int
    chunks: Tuple[ChunkState, ...]


@dataclass(frozen=True)
class SendPeerReady:
    """Event: tell the other racks that this core has registered (and set up) a batch."""

    batch: int


class HierarchicalJobState(JobState):
    """A JobState whose rounds finish only when every rack's partial is in."""

    def __init__(self, *args, rack: int, racks: int, **kwargs):
        super().__init__(*args, **kwargs)
        if not 0 <= rack < racks:
            raise ValueError(f"rack {rack} outside 0..{racks - 1}")
        self.rack, self.racks = rack, racks
        self._all_racks = (1 << racks) - 1
        self._partials: Dict[int, np.ndarray] = {}  # chunk id -> (2, racks, size) view
        self._partial_views: Dict[int, List[List[memoryview]]] = {}
        self._partial_mask: Dict[int, List[int]] = {}  # chunk id -> arrived racks, by parity
        self._announced: Set[int] = set()
        self._peer_ready: Dict[int, Set[int]] = {}

    def _allocate(self, chunks: List[Chunk]) -> None:
        super()._allocate(chunks)
        total = sum(c.size for c in chunks)
        partials = np.zeros((2, self.racks, total), dtype=np.float32)
        offset = 0
        for c in chunks:
            view = partials[:, :, offset:offset + c.size]
            self._partials[c.id] = view
            self._partial_views[c.id] = [[memoryview(view[p, r]).cast("B") for r in range(self.racks)]
                                         for p in range(2)]
            self._partial_mask[c.id] = [0, 0]
            offset += c.size

    # -- initial weights: rack 0's win ---------------------------------------------------------
    def init_target(self, rank: int, header: wire.Header, lane: int) -> memoryview:
        if self.rack == 0:
            return super().init_target(rank, header, lane)
        if rank != 0:
            raise ProtocolError(f"INIT frame from rank {header.sender}: only the first worker sets initial weights")
        return self.owned_chunk(header, lane).slot_views[0]  # read and dropped: rack 0's values win

    def on_init(self, header: wire.Header, lane: int) -> list:
        return super().on_init(header, lane) if self.rack == 0 else []

    def peer_init_target(self, from_rack: int, header: wire.Header) -> memoryview:
        if from_rack != 0 or self.rack == 0:
            raise ProtocolError(f"rack {from_rack} sent initial weights; only rack 0 does, to the others")
        state = self.owned_chunk(header)
        if state.chunk.id not in self._uninitialized.get((state.chunk.lane, state.chunk.batch), ()):
            raise ProtocolError(f"rack 0 initialized chunk {state.chunk.id} twice")
        return state.weight_view

    def on_peer_init(self, header: wire.Header) -> list:
        chunk = self.owned[header.chunk].chunk
        self._uninitialized[(chunk.lane, chunk.batch)].discard(chunk.id)
        return self._ready(chunk.lane, chunk.batch)

    def _batch_progress(self, batch: int) -> list:
        if batch in self._announced:
            return []
        lanes = sorted(self.lanes)
        if any(len(self._registered[(lane, batch)]) < self.num_workers for lane in lanes):
            return []
        if self.rack == 0 and any(self._uninitialized[(lane, batch)] for lane in lanes):
            return []
        self._announced.add(batch)
        if self.rack != 0:
            return [SendPeerReady(batch)]
        return [SendPeerReady(batch)] + [self._peer_init(rack, batch) for rack in sorted(self._peer_ready.get(batch, ()))]

    def _peer_init(self, rack: int, batch: int) -> SendPeerInit:
        # Sent only once `rack` has registered the batch (its PEER_READY), so it can place the chunks.
        return SendPeerInit(rack, tuple(s for s in self.owned.values() if s.chunk.batch == batch))

    def on_peer_ready(self, from_rack: int, batch) -> list:
        if not isinstance(batch, int) or batch < 0:
            raise ProtocolError(f"rack {from_rack} sent PEER_READY for batch {batch!r}")
        ready = self._peer_ready.setdefault(batch, set())
        if from_rack in ready:
            raise ProtocolError(f"rack {from_rack} sent PEER_READY for batch {batch} twice")
        ready.add(from_rack)
        events = [self._peer_init(from_rack, batch)] if self.rack == 0 and batch in self._announced else []
        if batch >= len(self._digests):
            return events  # not registered here yet; our own registration will find it ready
        return events + self._ready_all(batch)

    def _peers_ready(self, batch: int) -> bool:
        return len(self._peer_ready.get(batch, ())) == self.racks - 1

    # -- rounds ---------------------------------------------------------------------------------
    finishes_rounds_here = False  # the round ends when every rack's partial is in

    def _local_round_done(self, state: ChunkState, acc: np.ndarray, last: Optional[np.ndarray]) -> list:
        iteration = state.rounds + 1
        parity = iteration % 2
        own = self._partials[state.chunk.id][parity, self.rack]
        self.kernels.scale(own, acc, last, 1.0)  # the rack's sum (times 1: exact)
        self._partial_mask[state.chunk.id][parity] |= 1 << self.rack
        events: list = [SendPartial(state, iteration, self._partial_views[state.chunk.id][parity][self.rack])]
        return events + self._try_finish(state)

    def partial_target(self, from_rack: int, header: wire.Header) -> memoryview:
        state = self.owned_chunk(header)
        if header.iteration not in (state.rounds + 1, state.rounds + 2):
            raise ProtocolError(f"rack {from_rack} sent chunk {header.chunk} of round {header.iteration}; "
                                f"this rack is at round {state.rounds + 1}")
        parity = header.iteration % 2
        if self._partial_mask[header.chunk][parity] >> from_rack & 1:
            raise ProtocolError(f"rack {from_rack} sent chunk {header.chunk} of round {header.iteration} twice")
        return self._partial_views[header.chunk][parity][from_rack]

    def on_partial(self, from_rack: int, header: wire.Header) -> list:
        state = self.owned[header.chunk]
        self._partial_mask[header.chunk][header.iteration % 2] |= 1 << from_rack
        return self._try_finish(state) if header.iteration == state.rounds + 1 else []

    def _try_finish(self, state: ChunkState) -> list:
        parity = (state.rounds + 1) % 2
        masks = self._partial_mask[state.chunk.id]
        if masks[parity] != self._all_racks:
            return []
        masks[parity] = 0
        parts = self._partials[state.chunk.id][parity]
        acc = state.acc  # the rack sum was taken out of it; reuse it for the total
        self.kernels.aggregate(acc, parts[0], True)
        for rack in range(1, self.racks - 1):
            self.kernels.aggregate(acc, parts[rack], False)
        return [self.finish_round(state, acc, parts[self.racks - 1])]

    def missing_racks(self, state: ChunkState) -> List[int]:
        mask = self._partial_mask[state.chunk.id][(state.rounds + 1) % 2]
        return [r for r in range(self.racks) if not mask >> r & 1]
