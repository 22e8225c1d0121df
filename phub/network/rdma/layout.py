"""Registration plan and slot addressing for the verbs transport, with no I/O.

PHub registers memory once ("one-shot registration") so that the data path never pins or looks
up pages. Here, for one job:

- Server side (`CoreRegistration`): for each (server core, NIC) the core serves, one protection
  domain and one memory region. The region covers every buffer of that core that this NIC reads
  or writes: the receive slots of the chunks carried on the core's lanes through that NIC (one
  slot per worker), and the chunks' weights and results (the sources of the writes back).
  Regions of different NICs are separate memory, so every slot lies in exactly one region.
- Worker side (`WorkerRegistration`): one region holding the worker's results (where the server
  writes new weights) and its gradients (the source of its pushes), chunk after chunk in chunk-id
  order, so each registered array is one contiguous span.

Inside a (core, NIC) region, each registered batch gets three page-aligned blocks laid out the
way `aggregation.JobState` lays out its arrays: the owned chunks of the batch in chunk-id order,
and the slots rank-major (rank r's slot of a chunk sits at row r). With one NIC per core this is
byte for byte the aggregation layout, so its arrays can be views of the registered memory.

    region (core c, NIC i):  [batch 0: slots N x E0 | weights E0 | results E0] [batch 1: ...] ...

Adding a batch appends blocks and never moves earlier ones, so a region registered for the
first batches stays valid; the later batches need their own registration (see `phub.network.rdma`).
Both sides compute the same plan from the same `ChunkPlan`, so a worker knows the remote offset
of every slot without asking: remote address = the region's base address (exchanged once per
connection, see `phub.network.rdma.connect`) + `slot(chunk, rank).offset`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from ...reduction.chunking import ITEMSIZE, Chunk, ChunkPlan
from ...errors import ConfigError
from . import immediate

PAGE_BYTES = 4096  # every block starts on a page: registration pins whole pages anyway


def _page_up(nbytes: int) -> int:
    return -(-nbytes // PAGE_BYTES) * PAGE_BYTES


@dataclass(frozen=True)
class Span:
    """Bytes [offset, offset + nbytes) of the registered region of NIC `interface`."""

    interface: int
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class BatchBlocks:
    """One batch's blocks in one (core, NIC) region."""

    batch: int
    chunk_ids: Tuple[int, ...]  # owned chunks of the batch on this NIC, chunk-id order
    elements: int  # float32 values per row (sum of the chunks' sizes)
    slots: int  # byte offset of the slot block: num_workers rows of `elements` values
    weights: int  # byte offset of the weight block (`elements` values)
    results: int  # byte offset of the result block (`elements` values)
    end: int  # first byte after the batch's blocks


class CoreRegistration:
    """The registered memory of one server core for one job: one region per NIC it serves.

    `lanes` are the lanes the core owns (`aggregation.JobState.lanes`). Raises ConfigError if the
    job does not fit the immediate (too many workers or chunks) or a lane is not in the plan.
    """

    def __init__(self, plan: ChunkPlan, lanes: Iterable[int], num_workers: int):
        lanes = frozenset(lanes)
        topology = plan.topology
        bad = sorted(lane for lane in lanes if not (isinstance(lane, int) and 0 <= lane < topology.lanes))
        if bad:
            raise ConfigError(f"lanes {bad} are not lanes of a topology with {topology.lanes} lanes")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be a positive integer, got {num_workers!r}")
        immediate.check_job(num_workers, len(plan.chunks), plan.chunk_bytes)
        self.plan = plan
        self.lanes = lanes
        self.num_workers = num_workers
        self.interfaces: Tuple[int, ...] = tuple(sorted({topology.lane_interface(lane) for lane in lanes}))
        self.blocks: Dict[int, List[BatchBlocks]] = {i: [] for i in self.interfaces}
        self.length: Dict[int, int] = {i: 0 for i in self.interfaces}  # region bytes, a page multiple
        # chunk id -> (its batch blocks, its element offset within a row)
        self._where: Dict[int, Tuple[BatchBlocks, int]] = {}
        self._laid = 0  # batches laid out so far
        for batch in range(len(plan.batches)):
            self._add_batch(batch)

    @classmethod
    def for_job_state(cls, state) -> "CoreRegistration":
        """The registration matching an `aggregation.JobState`: its plan, its lanes, and one slot
        row per worker it serves (with racks, the rack's workers; rows are their local indices)."""
        ranks = getattr(state, "total_workers", state.num_workers)  # job-wide ranks go in immediates
        immediate.check_job(ranks, len(state.plan.chunks), state.plan.chunk_bytes, state.job_id)
        return cls(state.plan, state.lanes, state.num_workers)

    def _add_batch(self, batch: int) -> None:
        self._laid = batch + 1
        topology = self.plan.topology
        chunks = [c for c in self.plan.chunks if c.batch == batch and c.lane in self.lanes]
        for interface in self.interfaces:
            mine = [c for c in chunks if topology.lane_interface(c.lane) == interface]
            if not mine:
                continue
            elements = sum(c.size for c in mine)
            row = elements * ITEMSIZE
            slots = self.length[interface]
            weights = slots + _page_up(row * self.num_workers)
            results = weights + _page_up(row)
            end = results + _page_up(row)
            blocks = BatchBlocks(batch, tuple(c.id for c in mine), elements, slots, weights, results, end)
            self.blocks[interface].append(blocks)
            self.length[interface] = end
            at = 0
            for c in mine:
                self._where[c.id] = (blocks, at)
                at += c.size

    def extend(self) -> List[int]:
        """Lay out the batches registered in the plan since; return their ids. Earlier blocks stay put.

        Raises ConfigError if the grown job no longer fits the immediate.
        """
        immediate.check_job(self.num_workers, len(self.plan.chunks), self.plan.chunk_bytes)
        new = list(range(self._laid, len(self.plan.batches)))
        for batch in new:
            self._add_batch(batch)
        return new

    # -- addressing -------------------------------------------------------------------------
    def owns(self, chunk_id: int) -> bool:
        return chunk_id in self._where

    def _locate(self, chunk_id: int) -> Tuple[Chunk, BatchBlocks, int, int]:
        try:
            blocks, at = self._where[chunk_id]
        except (KeyError, TypeError):
            raise ConfigError(f"chunk {chunk_id!r} is not owned by this core's lanes") from None
        chunk = self.plan.chunks[chunk_id]
        return chunk, blocks, at, self.plan.topology.lane_interface(chunk.lane)

    def slot(self, chunk_id: int, rank: int) -> Span:
        """Where worker `rank`'s copy of chunk `chunk_id` lands (the target of its push).

        `rank` is the worker's slot row: its rank, or with racks its index among this rack's workers.
        """
        chunk, blocks, at, interface = self._locate(chunk_id)
        if not isinstance(rank, int) or not 0 <= rank < self.num_workers:
            raise ConfigError(f"rank {rank!r} is outside the job's {self.num_workers} workers")
        offset = blocks.slots + (rank * blocks.elements + at) * ITEMSIZE
        return Span(interface, offset, chunk.nbytes)

    def weights(self, chunk_id: int) -> Span:
        """The chunk's weights (what an optimizer mode writes back to every worker)."""
        chunk, blocks, at, interface = self._locate(chunk_id)
        return Span(interface, blocks.weights + at * ITEMSIZE, chunk.nbytes)

    def result(self, chunk_id: int) -> Span:
        """The chunk's aggregate (what aggregation-only mode writes back)."""
        chunk, blocks, at, interface = self._locate(chunk_id)
        return Span(interface, blocks.results + at * ITEMSIZE, chunk.nbytes)

    def batch_blocks(self, interface: int, batch: int) -> Optional[BatchBlocks]:
        """Batch `batch`'s blocks in NIC `interface`'s region (None: none of its chunks go there)."""
        return next((b for b in self.blocks.get(interface, ()) if b.batch == batch), None)

    def in_batch_region(self, span: Span, chunk_id: int) -> int:
        """`span`'s offset from the start of its batch's blocks: its address in a region
        registered per batch (how the data path registers, as batches arrive one by one)."""
        blocks, _ = self._where[chunk_id]
        return span.offset - blocks.slots

    def regions(self) -> List[Tuple[int, int]]:
        """(interface, bytes) of each memory region to register: one PD and one MR per NIC."""
        return [(interface, self.length[interface]) for interface in self.interfaces]


def core_lanes(plan: ChunkPlan) -> Dict[Tuple[int, int], List[int]]:
    """Every (server, core) of the plan's topology with the lanes it owns (server is 0 unless sharded)."""
    topology = plan.topology
    lane_server = getattr(topology, "lane_server", lambda lane: 0)
    owners: Dict[Tuple[int, int], List[int]] = {}
    for lane in range(topology.lanes):
        owners.setdefault((lane_server(lane), topology.lane_core(lane)), []).append(lane)
    return owners


def remote_slots(plan: ChunkPlan, num_workers: int) -> Dict[Tuple[int, int], CoreRegistration]:
    """What a worker computes to address every server slot: each (server, core)'s registration.

    For chunk c pushed by rank r: the owner is `(server, topology.lane_core(c.lane))`, and
    `remote_slots(...)[owner].slot(c.id, r)` gives the NIC and the offset in that NIC's region.
    """
    return {owner: CoreRegistration(plan, lanes, num_workers) for owner, lanes in core_lanes(plan).items()}


class WorkerRegistration:
    """A worker's registered region: results block, then gradients block, both page-aligned.

    It covers the plan's chunks, or with `batch` only that batch's (one region per batch, as the
    data path registers them). A chunk's values sit at the same position in both blocks: the sum
    of the sizes of the covered chunks before it, i.e. where they sit in the concatenation of the
    registered arrays.
    """

    def __init__(self, plan: ChunkPlan, batch: Optional[int] = None):
        immediate.check_job(1, len(plan.chunks), plan.chunk_bytes)
        self.plan = plan
        self.position: Dict[int, int] = {}  # element offset of each covered chunk
        at = 0
        for chunk in plan.chunks:
            if batch is None or chunk.batch == batch:
                self.position[chunk.id] = at
                at += chunk.size
        if not at:
            raise ConfigError(f"batch {batch!r} has no chunks in the plan")
        self.elements = at
        self.results = 0
        self.gradients = _page_up(at * ITEMSIZE)
        self.length = self.gradients + _page_up(at * ITEMSIZE)

    def _chunk(self, chunk_id: int) -> Chunk:
        if chunk_id not in self.position:
            raise ConfigError(f"chunk {chunk_id!r} is not among this region's {len(self.position)} chunks")
        return self.plan.chunks[chunk_id]

    def result(self, chunk_id: int) -> Tuple[int, int]:
        """(offset, nbytes) where the server writes chunk `chunk_id`'s new values."""
        chunk = self._chunk(chunk_id)
        return self.results + self.position[chunk_id] * ITEMSIZE, chunk.nbytes

    def gradient(self, chunk_id: int) -> Tuple[int, int]:
        """(offset, nbytes) of chunk `chunk_id`'s gradient, the source of the push."""
        chunk = self._chunk(chunk_id)
        return self.gradients + self.position[chunk_id] * ITEMSIZE, chunk.nbytes

    def key_elements(self, key) -> Tuple[int, int]:
        """(first element, elements) of a registered array within either block."""
        chunks = self.plan.key_chunks(key)
        return self.position[chunks[0].id], self.plan.key_size(key)
