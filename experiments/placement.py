"""Where each system under test puts a model's bytes: every server link's share, with no I/O.

`placement(system, elements, settings, workers)` takes a model layout (`elements`: each array's
element count in MXNet key order, which is the layout's order; keys are 0..K-1 as the workers
register them), the system's settings as its `describe` puts them in a result row (servers,
bigarray_bound, chunk_bytes, interfaces, ...) and the number of workers, and returns how one
worker's push of the model spreads over the system's *endpoints* (what one server link carries):

* **pslite-central, pslite-shard** (MXNet 1.9.1's `dist_sync` kvstore): one endpoint per server.
  A key is placed as KVStoreDist::EncodeDefaultKey (src/kvstore/kvstore_dist.h) places it: an
  array of fewer than MXNET_KVSTORE_BIGARRAY_BOUND elements goes whole to server
  (key x 9973) mod S; a larger one (at least the bound) is cut into one part per server, part i
  holding round(n / S x (i+1)) - round(n / S x i) elements (C's round: halves away from zero).
  ps-lite sends one message per (key, server) part. Neither ps-lite nor its ZeroMQ van has a
  size knob (DMLC_PS_WATER_MARK, unset here, counts messages), so the bound is MXNet's only one.
* **phub, pshard**: one endpoint per (server, interface), in that order: phub's own plan
  (`phub.reduction.chunking.ChunkPlan`, one registration batch as the benchmark's workers make) with the
  run's chunk bytes, interfaces, cores and lanes per pair; one message per chunk. With several
  racks each worker pushes to its own rack's PBox, so the endpoints are one PBox's interfaces.
* **gloo-ring**: no servers; the equivalent is one endpoint per rank: the bytes that rank sends
  in gloo's ring allreduce of the whole (concatenated) gradient, as gloo's `ring` in
  gloo/allreduce.cc cuts it: numSegments = the least multiple of N that is at least
  max(ceil(bytes / 1 MiB), 2N), segments of ceil(bytes / numSegments) rounded up to whole
  elements; each rank sends numSegments - numSegments / N of them in the reduce-scatter and as
  many in the allgather (the last ones may be short or empty). Gloo's segment bound (1 MiB,
  kMaxSegmentSize) is its only size knob and torch's process group does not expose it: a scaled
  run keeps 1 MiB, which changes how many segments the ring pipelines (about bytes / 1 MiB for the
  paper's models, but never under 2N: AlexNet over 8 ranks takes 350 sends per rank at s_m = 1 and
  28 at s_m = 66.7), never a rank's share of the bytes. Gloo cuts no keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import FrozenSet, List, Mapping, Sequence, Tuple

from phub.reduction.chunking import ChunkPlan, Topology
from phub.errors import ConfigError

ITEMSIZE = 4  # float32, every system
MXNET_KEY_SPREAD = 9973  # kvstore_dist.h: a small key goes to server (key * 9973) % servers
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024  # gloo/allreduce.h kMaxSegmentSize (torch keeps the default)


@dataclass(frozen=True)
class Placement:
    """One worker's push of a model on one system (its pulls mirror it)."""

    endpoint_bytes: Tuple[int, ...]  # bytes on each endpoint (server link; a rank's sends for gloo)
    split_keys: FrozenSet[int]  # keys cut into more than one part (MXNet: over the servers; phub: chunks)
    messages: int  # data messages one worker sends per exchange, one direction

    @property
    def shares(self) -> Tuple[float, ...]:
        """Each endpoint's fraction of the bytes (they sum to 1)."""
        total = sum(self.endpoint_bytes)
        return tuple(b / total for b in self.endpoint_bytes)


def _c_round(x: float) -> int:
    """C's round() of a non-negative double: halves away from zero (Python's round goes to even)."""
    whole = math.floor(x)
    return whole + 1 if x - whole >= 0.5 else whole


def mxnet_key_parts(key: int, elements: int, servers: int, bound: int) -> List[Tuple[int, int]]:
    """(server, elements) of each part of one key, as MXNet 1.9.1's EncodeDefaultKey cuts it."""
    if elements < bound:
        return [((key * MXNET_KEY_SPREAD) % servers, elements)]
    # double arithmetic in the same order as the C++: n / S, then times (i + 1)
    edges = [_c_round(elements / servers * i) for i in range(servers + 1)]
    return [(i, edges[i + 1] - edges[i]) for i in range(servers)]


def _pslite(elements: Sequence[int], servers: int, bound: int) -> Placement:
    loads = [0] * servers
    split, messages = set(), 0
    for key, n in enumerate(elements):
        parts = mxnet_key_parts(key, n, servers, bound)
        for server, size in parts:
            loads[server] += size * ITEMSIZE
        messages += len(parts)
        if len(parts) > 1:
            split.add(key)
    return Placement(tuple(loads), frozenset(split), messages)


def _phub(elements: Sequence[int], servers: int, interfaces: int, cores: int, lanes_per_pair: int,
          chunk_bytes: int) -> Placement:
    topology = Topology(interfaces, cores, lanes_per_pair, servers)
    plan = ChunkPlan(topology, chunk_bytes)
    chunks = plan.add_arrays(list(enumerate(elements)))
    loads = [0] * (servers * interfaces)
    for lane, load in enumerate(plan.lane_loads):  # bytes per lane, as the plan balanced them
        loads[topology.lane_server(lane) * interfaces + topology.lane_interface(lane)] += load
    split = frozenset(chunk.key for chunk in chunks if chunk.offset > 0)  # a second chunk starts inside it
    return Placement(tuple(loads), split, len(chunks))


def gloo_ring_sends(total_bytes: int, ranks: int, max_segment_bytes: int = GLOO_MAX_SEGMENT_BYTES) -> Placement:
    """Bytes each rank sends in gloo's ring allreduce of `total_bytes` of float32 (see above)."""
    if ranks == 1:
        return Placement((0,), frozenset(), 0)  # one rank: gloo reduces in place, sends nothing
    segment_cap = ITEMSIZE * max(1, max_segment_bytes // ITEMSIZE)
    wanted = max(math.ceil(total_bytes / segment_cap), 2 * ranks)
    segments = math.ceil(wanted / ranks) * ranks
    per_rank = segments // ranks
    segment = math.ceil(math.ceil(total_bytes / segments) / ITEMSIZE) * ITEMSIZE
    sent, sends = [0] * ranks, [0] * ranks
    for rank in range(ranks):
        for first in (rank + 1, rank):  # reduce-scatter starts one rank on, allgather at its own
            for i in range(segments - per_rank):
                offset = ((first * per_rank + i) * segment) % (segments * segment)
                length = min(segment, total_bytes - offset)
                if length > 0:  # a segment past the end is skipped
                    sent[rank] += length
                    sends[rank] += 1
    return Placement(tuple(sent), frozenset(), max(sends))


def _setting(settings: Mapping, name: str, system: str) -> int:
    value = settings.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"placement of {system}: setting {name!r} must be a positive integer, got {value!r}")
    return value


def placement(system: str, elements: Sequence[int], settings: Mapping, workers: int) -> Placement:
    """How one worker's push of a layout spreads over `system`'s endpoints (module docstring).
    `settings`: the system's `describe` of the run. Raises ConfigError naming a missing setting
    or an unknown system."""
    if not elements or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in elements):
        raise ConfigError(f"placement of {system}: every array needs a positive whole element count")
    if system in ("pslite-central", "pslite-shard"):
        return _pslite(elements, _setting(settings, "servers", system), _setting(settings, "bigarray_bound", system))
    if system in ("phub", "pshard"):
        servers = _setting(settings, "servers", system) // settings.get("racks", 1)  # a worker's PBoxes
        return _phub(elements, servers, _setting(settings, "interfaces", system), _setting(settings, "cores", system),
                     settings.get("lanes_per_pair", 1), _setting(settings, "chunk_bytes", system))
    if system == "gloo-ring":
        return gloo_ring_sends(ITEMSIZE * sum(elements), workers)
    raise ConfigError(f"placement: unknown system {system!r}")
