"""Two-phase (hierarchical) reduction across racks, as a reduce-scatter / all-gather, with no I/O.

Each rack has its own server (a PBox). Phase one is the ordinary tall aggregation of the rack's
workers. Phase two runs between the racks' servers over the core network: every chunk has an
*owner rack* (`owner_racks`: balanced, and the same on every server because every server computes
the same chunk plan). A rack that does not own a chunk sends its aggregate of the chunk (its
*partial*) to the owner only; the owner adds all racks' partials **in rack order** (0, 1, ...,
R-1) into the chunk's *total* and sends the total back to every other rack. Every rack then runs
the optimizer on the same total bytes, so every rack ends with bit-identical weights; rack 0's
initial weights are copied to the other racks before training starts so that they also start
identical. Per rack and round that is 2(R-1)/R of the model out (and in), where sending every
partial to every rack (a broadcast) was R-1 models.

Who talks to whom: a chunk's lane is pinned to one core and one interface of a PBox, and the racks'
PBoxes have the same shape, so core c / interface i of rack r exchanges exactly the chunks of its
lanes with core c / interface i of the other racks, over one link per (rack, interface). The events
below carry the chunk; the core sends them on the link of the chunk's interface.

Why one buffer of each kind per chunk is enough: a rack sends its round k+1 partial only after it
has the round k total, which the owner sends only once it has every round k partial. So an owner
never holds two rounds' partials, a rack's partial has left before it is rewritten, and the total
has reached every rack before the next one is written over it. Anything else is a peer's bug.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..protocol import wire
from .aggregation import ChunkState, JobState
from .chunking import Chunk, Topology
from ..errors import ProtocolError

# HierarchicalJobState.rack_table's columns, by chunk id: the rack that sums the chunk (-1: another
# core's chunk), the racks whose partial of this round is in (a bit each), the chunk's interface.
# The C rack loops read and write them by these names (phub/network/fastpath_contract.py).
RACK_TABLE_COLUMNS = ("owner", "arrived", "interface")
_OWNER, _ARRIVED, _INTERFACE = (RACK_TABLE_COLUMNS.index(name) for name in ("owner", "arrived", "interface"))


@dataclass(frozen=True)
class SendPartial:
    """Event: send this rack's partial of a chunk (round `iteration`) to the chunk's owner rack."""

    state: ChunkState
    iteration: int
    view: memoryview
    owner: int


@dataclass(frozen=True)
class SendTotal:
    """Event (the chunk's owner): send the chunk's total over all racks (round `iteration`) to
    every other rack."""

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


def owner_racks(chunks: Sequence[Chunk], topology: Topology, racks: int, loads: Dict[Tuple[int, int], List[int]]
                ) -> Dict[int, int]:
    """The owner rack of each chunk: in chunk-id order, each goes to the rack that owns the fewest
    bytes so far on the chunk's (core, interface), so every link between two racks carries the same
    bytes both ways. Ties go to the first rack counted from the (core, interface)'s index, so that
    the odd chunk does not always land on rack 0. `loads` ((core, interface) -> bytes per rack) is
    updated: pass the same dict for every batch of a job."""
    owners = {}
    for chunk in chunks:
        pair = (topology.lane_core(chunk.lane), topology.lane_interface(chunk.lane))
        rack_loads = loads.setdefault(pair, [0] * racks)
        first = (pair[0] * topology.interfaces + pair[1]) % racks
        owner = min(range(racks), key=lambda r: (rack_loads[r], (r - first) % racks))
        rack_loads[owner] += chunk.nbytes
        owners[chunk.id] = owner
    return owners


class HierarchicalJobState(JobState):
    """A JobState whose rounds finish when the chunk's total over every rack is in."""

    def __init__(self, *args, rack: int, racks: int, **kwargs):
        super().__init__(*args, **kwargs)
        if not 0 <= rack < racks or racks < 2:
            raise ValueError(f"rack {rack} outside 0..{racks - 1} (at least two racks)")
        self.rack, self.racks = rack, racks
        self._all_racks = (1 << racks) - 1
        self.owner: Dict[int, int] = {}  # chunk id -> the rack that sums it
        self._owner_loads: Dict[Tuple[int, int], List[int]] = {}
        # Per chunk: rows of `size` floats. The owner: one partial per rack (rack order), then the
        # total; another rack: its own partial, then the total it receives.
        self._rows: Dict[int, np.ndarray] = {}
        self._row_views: Dict[int, List[memoryview]] = {}
        # What the C rack loop (phub/_fastpath_racks.h) reads and writes, by chunk id, beside the
        # fast_table: a row of RACK_TABLE_COLUMNS (on another rack than the owner, "arrived" holds
        # only its own bit), and the chunk's rows (None: another core's). The Python path keeps
        # its arrival bits here too, so both paths see one truth.
        self.rack_table = np.zeros((0, len(RACK_TABLE_COLUMNS)), dtype=np.int64)
        self.rack_rows: List[Optional[np.ndarray]] = []
        self._announced: Set[int] = set()
        self._peer_ready: Dict[int, Set[int]] = {}

    def _allocate(self, chunks: List[Chunk]) -> None:
        super()._allocate(chunks)
        self.owner.update(owner_racks(chunks, self.plan.topology, self.racks, self._owner_loads))
        heights = [self.racks + 1 if self.owner[c.id] == self.rack else 2 for c in chunks]
        rows = np.zeros(sum(h * c.size for h, c in zip(heights, chunks)), dtype=np.float32)
        offset = 0
        for c, height in zip(chunks, heights):
            block = rows[offset:offset + height * c.size].reshape(height, c.size)
            self._rows[c.id] = block
            self._row_views[c.id] = [memoryview(row).cast("B") for row in block]
            offset += height * c.size

    def _extend_fast_table(self, new: List[Chunk]) -> None:
        super()._extend_fast_table(new)
        rows = np.zeros((len(new), len(RACK_TABLE_COLUMNS)), dtype=np.int64)
        for i, c in enumerate(new):
            owned = c.id in self.owned
            rows[i, _OWNER] = self.owner[c.id] if owned else -1
            rows[i, _ARRIVED], rows[i, _INTERFACE] = 0, self.plan.topology.lane_interface(c.lane)
            self.rack_rows.append(self._rows[c.id] if owned else None)
        self.rack_table = np.concatenate([self.rack_table, rows])

    def arrived_bits(self, chunk_id: int) -> int:
        """The racks whose partial of the chunk's current round is in (a bit each)."""
        return int(self.rack_table[chunk_id, _ARRIVED])

    def _set_arrived(self, chunk_id: int, bits: int) -> None:
        self.rack_table[chunk_id, _ARRIVED] = bits

    def interface_of(self, chunk_id: int) -> int:
        """The interface whose link carries the chunk between racks (its lane's)."""
        return self.plan.topology.lane_interface(self.owned[chunk_id].chunk.lane)

    def _own_row(self, chunk_id: int) -> int:
        return self.rack if self.owner[chunk_id] == self.rack else 0

    # -- initial weights: rack 0's win ---------------------------------------------------------
    def init_target(self, rank: int, header: wire.Header, lane: int) -> memoryview:
        if self.rack == 0:
            return super().init_target(rank, header, lane)
        if rank != 0:
            raise ProtocolError(f"INIT frame from rank {header.sender}: only the first worker sets initial weights")
        return self.owned_chunk(header, lane).slot_views[0]  # read and dropped: rack 0's values win

    def on_init(self, header: wire.Header, lane: int) -> list:
        return super().on_init(header, lane) if self.rack == 0 else []

    def peer_init_target(self, from_rack: int, header: wire.Header, interface: Optional[int] = None) -> memoryview:
        if from_rack != 0 or self.rack == 0:
            raise ProtocolError(f"rack {from_rack} sent initial weights; only rack 0 does, to the others")
        state = self._rack_chunk(from_rack, header, interface)
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
        waiting = sorted(self._peer_ready.get(batch, ()))
        return [SendPeerReady(batch)] + [self._peer_init(rack, batch) for rack in waiting]

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
    finishes_rounds_here = False  # the round ends when the chunk's total over every rack is in

    def _local_round_done(self, state: ChunkState, acc: np.ndarray, last: Optional[np.ndarray]) -> list:
        cid = state.chunk.id
        row = self._own_row(cid)
        self.kernels.scale(self._rows[cid][row], acc, last, 1.0)  # the rack's sum (times 1: exact)
        self._set_arrived(cid, self.arrived_bits(cid) | 1 << self.rack)
        owner = self.owner[cid]
        if owner == self.rack:
            return self._try_sum(state)
        return [SendPartial(state, state.rounds + 1, self._row_views[cid][row], owner)]

    def _rack_chunk(self, from_rack: int, header: wire.Header, interface: Optional[int]) -> ChunkState:
        """The chunk a rack's data frame is for, checked against the plan and, when given, against
        the interface whose link it came on."""
        state = self.owned_chunk(header)
        if interface is not None and self.plan.topology.lane_interface(state.chunk.lane) != interface:
            raise ProtocolError(f"rack {from_rack} sent chunk {header.chunk} on interface {interface}'s link; "
                                f"its lane is on interface {self.interface_of(header.chunk)}")
        return state

    def _check_round(self, from_rack: int, header: wire.Header, state: ChunkState, what: str) -> None:
        if header.iteration != state.rounds + 1:
            raise ProtocolError(f"rack {from_rack} sent the {what} of chunk {header.chunk} for round "
                                f"{header.iteration}; this rack is at round {state.rounds + 1}")

    def partial_target(self, from_rack: int, header: wire.Header, interface: Optional[int] = None) -> memoryview:
        """Where another rack's partial of a chunk this rack owns goes (its row)."""
        state = self._rack_chunk(from_rack, header, interface)
        owner = self.owner[header.chunk]
        if owner != self.rack:
            raise ProtocolError(f"rack {from_rack} sent its partial of chunk {header.chunk} to rack {self.rack}; "
                                f"rack {owner} owns that chunk")
        if from_rack == self.rack:
            raise ProtocolError(f"rack {from_rack} sent a partial to itself")
        self._check_round(from_rack, header, state, "partial")
        if self.arrived_bits(header.chunk) >> from_rack & 1:
            raise ProtocolError(f"rack {from_rack} sent chunk {header.chunk} of round {header.iteration} twice")
        return self._row_views[header.chunk][from_rack]

    def on_partial(self, from_rack: int, header: wire.Header) -> list:
        self._set_arrived(header.chunk, self.arrived_bits(header.chunk) | 1 << from_rack)
        return self._try_sum(self.owned[header.chunk])

    def _try_sum(self, state: ChunkState) -> list:
        """The owner: once every rack's partial is in, add them in rack order into the total, send
        it to the other racks and finish the round on it."""
        cid = state.chunk.id
        if self.arrived_bits(cid) != self._all_racks:
            return []
        self._set_arrived(cid, 0)
        rows = self._rows[cid]
        total = rows[self.racks]
        self.kernels.scale(total, rows[0], rows[1], 1.0)
        for rack in range(2, self.racks):
            self.kernels.aggregate(total, rows[rack], False)
        return [SendTotal(state, state.rounds + 1, self._row_views[cid][self.racks]),
                self.finish_round(state, total, None)]

    def total_target(self, from_rack: int, header: wire.Header, interface: Optional[int] = None) -> memoryview:
        """Where the owner's total of a chunk goes, on a rack that sent it its partial."""
        state = self._rack_chunk(from_rack, header, interface)
        owner = self.owner[header.chunk]
        if from_rack != owner:
            raise ProtocolError(f"rack {from_rack} sent the total of chunk {header.chunk}; rack {owner} owns it")
        if owner == self.rack:
            raise ProtocolError(f"rack {from_rack} sent a total to itself")
        self._check_round(from_rack, header, state, "total")
        if not self.arrived_bits(header.chunk) >> self.rack & 1:
            raise ProtocolError(f"rack {from_rack} sent the total of chunk {header.chunk} for round {header.iteration} "
                                "before this rack sent its partial")
        return self._row_views[header.chunk][1]

    def on_total(self, from_rack: int, header: wire.Header) -> list:
        state = self.owned[header.chunk]
        self._set_arrived(header.chunk, 0)
        return [self.finish_round(state, self._rows[header.chunk][1], None)]

    def missing_racks(self, state: ChunkState) -> List[int]:
        """The racks a chunk's round waits for: the owner's total, or (on the owner) partials."""
        cid = state.chunk.id
        owner = self.owner[cid]
        if owner != self.rack:
            return [owner] if self.arrived_bits(cid) else []
        return [r for r in range(self.racks) if not self.arrived_bits(cid) >> r & 1]


class SimulatedRacksJobState(JobState):
    """One PBox standing in for `racks` racks, as the paper measured its cross-rack overhead:
    after a chunk's local aggregation, its core sends the aggregate through its own interface back
    to itself and adds it again, once per simulated rack, one trip after the other, before the
    optimizer. The total is then `racks` times the rack's sum: what `racks` racks whose workers
    pushed this rack's gradients would make, and the optimizer averages over that many workers.

    The trips ride the chunk's interface's link from the core to itself, as PARTIAL frames (rack
    `rack` to itself): the events and targets are those of HierarchicalJobState, the owner of
    every chunk being this rack. Rows per chunk: the aggregate that travels, the copy that comes
    back, the total."""

    finishes_rounds_here = False

    def __init__(self, *args, racks: int, **kwargs):
        super().__init__(*args, **kwargs)
        if racks < 2:
            raise ValueError(f"simulating {racks} rack(s): at least two")
        self.racks, self.rack = racks, 0
        self.total_workers *= racks
        self._rows: Dict[int, np.ndarray] = {}
        self._row_views: Dict[int, List[memoryview]] = {}
        self._trips: Dict[int, int] = {}  # chunk id -> copies back this round (-1: still aggregating locally)

    def _allocate(self, chunks: List[Chunk]) -> None:
        super()._allocate(chunks)
        rows = np.zeros(3 * sum(c.size for c in chunks), dtype=np.float32)
        offset = 0
        for c in chunks:
            block = rows[offset:offset + 3 * c.size].reshape(3, c.size)
            self._rows[c.id] = block
            self._row_views[c.id] = [memoryview(row).cast("B") for row in block]
            self._trips[c.id] = -1
            offset += 3 * c.size

    def interface_of(self, chunk_id: int) -> int:
        return self.plan.topology.lane_interface(self.owned[chunk_id].chunk.lane)

    def _local_round_done(self, state: ChunkState, acc: np.ndarray, last: Optional[np.ndarray]) -> list:
        cid = state.chunk.id
        self.kernels.scale(self._rows[cid][0], acc, last, 1.0)  # the rack's sum (times 1: exact)
        self._trips[cid] = 0
        return [SendPartial(state, state.rounds + 1, self._row_views[cid][0], self.rack)]

    def partial_target(self, from_rack: int, header: wire.Header, interface: Optional[int] = None) -> memoryview:
        """Where a chunk's aggregate lands when it comes back over the core's own link."""
        state = self.owned_chunk(header)
        if interface is not None and self.interface_of(header.chunk) != interface:
            raise ProtocolError(f"chunk {header.chunk} came back on interface {interface}'s link; "
                                f"its lane is on interface {self.interface_of(header.chunk)}")
        if from_rack != self.rack or header.iteration != state.rounds + 1 or self._trips[header.chunk] < 0:
            raise ProtocolError(f"a copy of chunk {header.chunk} (round {header.iteration}) came back that was "
                                f"never sent (this core is at round {state.rounds + 1})")
        return self._row_views[header.chunk][1]

    def on_partial(self, from_rack: int, header: wire.Header) -> list:
        cid = header.chunk
        state, rows = self.owned[cid], self._rows[cid]
        self.kernels.aggregate(rows[2], rows[1], self._trips[cid] == 0)
        self._trips[cid] += 1
        if self._trips[cid] < self.racks:  # another trip, after this one (as the paper's PBox did)
            return [SendPartial(state, state.rounds + 1, self._row_views[cid][0], self.rack)]
        self._trips[cid] = -1
        return [self.finish_round(state, rows[2], None)]

    def missing_racks(self, state: ChunkState) -> List[int]:
        return [self.rack] if self._trips[state.chunk.id] >= 0 else []
