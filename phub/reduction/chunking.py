"""Key chunking and balanced placement, with no I/O.

Every registered array is cut into fixed-size chunks (32 KB = 8192 float32 by default; the last
chunk of an array holds the remainder). Chunks are then placed on *lanes*: a lane is one
connection of every worker to the server, pinned to one server interface and one server core.

Placement follows PHub: chunks go to lanes by greedy size balancing (largest first, each to the
least-loaded lane); lanes are laid out so that every interface and every core carries the same
number of lanes, which keeps interfaces and cores as balanced as the lanes. Because every worker
(and every server core) computes the same plan from the same registration sequence, a chunk's
copies from all workers meet on one core with no coordination.

Arrays are registered in batches (one `add_arrays` call each, one `init` call of the worker API).
Each batch is balanced on top of the loads the earlier batches left.
"""
from __future__ import annotations

import hashlib
import heapq
import json
from dataclasses import dataclass
from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError

DEFAULT_CHUNK_BYTES = 32 * 1024
ITEMSIZE = 4  # float32
# The largest chunk: its frame's length field is 32 bits and the C loops keep a chunk's bytes in
# an int32 (phub/_fastpath.c's tables), so the largest multiple of 4 below 2**31.
MAX_CHUNK_BYTES = 2**31 - ITEMSIZE


@dataclass(frozen=True)
class Topology:
    """The server side of a job: `servers` identical servers (shards; 1 for a PBox), each with
    `interfaces` interfaces (the PBox's NICs) and `cores` cores (one process each).

    `lanes_per_pair` connections are opened for every (server, interface, core).
    """

    interfaces: int = 1
    cores: int = 1
    lanes_per_pair: int = 1
    servers: int = 1

    def __post_init__(self):
        for name in ("interfaces", "cores", "lanes_per_pair", "servers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Topology.{name} must be a positive integer, got {value!r}")

    @property
    def lanes(self) -> int:
        return self.servers * self.interfaces * self.cores * self.lanes_per_pair

    # Consecutive lanes walk the servers first, then the interfaces, then the cores, so that any
    # prefix of the lanes (what the greedy placement fills first) is spread over all of them.
    def lane_server(self, lane: int) -> int:
        return lane % self.servers

    def lane_interface(self, lane: int) -> int:
        return lane // self.servers % self.interfaces

    def lane_core(self, lane: int) -> int:
        return lane // (self.servers * self.interfaces) % self.cores

    def core_lanes(self, core: int, server: int = 0) -> List[int]:
        return [lane for lane in range(self.lanes)
                if self.lane_core(lane) == core and self.lane_server(lane) == server]


@dataclass(frozen=True)
class Chunk:
    id: int
    key: Hashable
    offset: int  # first element within its array
    size: int  # elements
    lane: int
    batch: int

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE


def chunk_elements(chunk_bytes: int) -> int:
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or \
            not ITEMSIZE <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise ConfigError(f"chunk_bytes must be an integer in [{ITEMSIZE}, {MAX_CHUNK_BYTES}] (a frame carries "
                          f"at most that), got {chunk_bytes!r}")
    if chunk_bytes % ITEMSIZE:
        raise ConfigError(f"chunk_bytes must be a multiple of {ITEMSIZE} (float32), got {chunk_bytes}")
    return chunk_bytes // ITEMSIZE


def array_elements(key: Hashable, shape) -> int:
    """Elements of an array of `shape` (a tuple, or an int for a 1-d array); 0-d and empty arrays are rejected."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not dims:
        raise ConfigError(f"array {key!r} is 0-d (a scalar); phub exchanges arrays of at least one dimension")
    size = 1
    for dim in dims:
        if not isinstance(dim, int) or dim < 0:
            raise ConfigError(f"array {key!r} has an invalid shape {dims!r}")
        size *= dim
    if size == 0:
        raise ConfigError(f"array {key!r} has shape {dims!r}, which holds no elements")
    return size


def as_float32(name: str, key, array, size: Optional[int] = None) -> np.ndarray:
    """`array` (a user's `name` for `key`: a gradient, an output, initial values) as the flat
    float32 view the plan's chunks are slices of (ITEMSIZE bytes an element); ConfigError unless
    it is a C-contiguous float32 numpy array, of `size` elements when given. No copy: the
    caller's memory is what is sent and written into."""
    if not isinstance(array, np.ndarray) or array.dtype != np.float32 or not array.flags.c_contiguous:
        raise ConfigError(f"{name} for key {key!r} must be a C-contiguous float32 numpy array")
    if size is not None and array.size != size:
        raise ConfigError(f"{name} for key {key!r} has {array.size} elements, the key was registered with {size}")
    return array.reshape(-1)


class ChunkPlan:
    """The deterministic chunk -> lane -> (interface, core) plan of one job."""

    def __init__(self, topology: Topology, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.topology = topology
        self.chunk_bytes = chunk_bytes
        self.chunk_elems = chunk_elements(chunk_bytes)
        self.chunks: List[Chunk] = []
        self.batches: List[List[Tuple[Hashable, int]]] = []
        self.lane_loads: List[int] = [0] * topology.lanes  # bytes
        self._key_chunks: Dict[Hashable, List[Chunk]] = {}
        self._key_sizes: Dict[Hashable, int] = {}
        self._key_spans: Dict[Hashable, List[Tuple[int, int, int]]] = {}

    def add_arrays(self, arrays: Iterable[Tuple[Hashable, object]]) -> List[Chunk]:
        """Register a batch of (key, shape) arrays; return the new chunks in chunk-id order."""
        batch = [(key, array_elements(key, shape)) for key, shape in arrays]
        if not batch:
            raise ConfigError("a registration batch must name at least one array")
        seen = set()
        for key, _ in batch:
            if key in self._key_sizes or key in seen:
                raise ConfigError(f"key {key!r} is registered twice")
            seen.add(key)
        batch_id = len(self.batches)
        pieces = []  # (key, offset, size) in chunk-id order
        for key, size in batch:
            for offset in range(0, size, self.chunk_elems):
                pieces.append((key, offset, min(self.chunk_elems, size - offset)))
        first_id = len(self.chunks)
        lanes = self._place([size for _, _, size in pieces])
        new = [
            Chunk(first_id + i, key, offset, size, lane, batch_id)
            for i, ((key, offset, size), lane) in enumerate(zip(pieces, lanes))
        ]
        self.chunks.extend(new)
        self.batches.append(batch)
        for key, size in batch:
            self._key_sizes[key] = size
            self._key_chunks[key] = []
        for chunk in new:
            self._key_chunks[chunk.key].append(chunk)
        return new

    def _place(self, sizes: Sequence[int]) -> List[int]:
        """Greedy size balancing: largest first, each to the least-loaded lane (ties: lowest id)."""
        heap = [(load, lane) for lane, load in enumerate(self.lane_loads)]
        heapq.heapify(heap)
        lanes = [0] * len(sizes)
        for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
            load, lane = heapq.heappop(heap)
            lanes[index] = lane
            load += sizes[index] * ITEMSIZE
            self.lane_loads[lane] = load
            heapq.heappush(heap, (load, lane))
        return lanes

    def key_chunks(self, key: Hashable) -> List[Chunk]:
        try:
            return self._key_chunks[key]
        except KeyError:
            raise ConfigError(f"key {key!r} was never registered (call init first)") from None

    def key_spans(self, key: Hashable) -> List[Tuple[int, int, int]]:
        """(chunk id, first byte, end byte) of each of a key's chunks within the key's array."""
        spans = self._key_spans.get(key)
        if spans is None:
            spans = self._key_spans[key] = [(c.id, c.offset * ITEMSIZE, (c.offset + c.size) * ITEMSIZE)
                                            for c in self.key_chunks(key)]
        return spans

    def key_size(self, key: Hashable) -> int:
        self.key_chunks(key)
        return self._key_sizes[key]

    def has_key(self, key: Hashable) -> bool:
        return key in self._key_sizes

    def lane_chunks(self, lane: int) -> List[Chunk]:
        return [c for c in self.chunks if c.lane == lane]

    def chunk_nbytes(self) -> List[int]:
        return [c.nbytes for c in self.chunks]

    @staticmethod
    def batch_digest(batch: Sequence[Tuple[Hashable, int]]) -> str:
        """A short fingerprint of a batch, to check that every worker registered the same arrays."""
        text = json.dumps([[repr(k), n] for k, n in batch], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]
