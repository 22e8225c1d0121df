"""What a job's exchange is made of, with no I/O: its layer groups, where each key's bytes go
(phub's chunk plan, MXNet's key placement), the units the replay moves, and the bytes and
messages each role handles per exchange (what the software-cost rows count, by the same rules as
`experiments.softcost.traffic`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

from experiments.softcost import gloo_segments
from phub.reduction.chunking import ChunkPlan, Topology

if TYPE_CHECKING:
    from .replay import Job

# phub's units hold at most 1/(groups x UNIT_SPLIT) of the model: its chunks go back one by
# one, so the last group's weights trail its backward by about a chunk, not a whole group. With
# 1/groups, phub's paper-scale times at 10 Gbps (ResNet-269, AlexNet, VGG-19) were 11-20% above
# the finest replay tried (48 groups, 8 units a group); with 4 units a group, within 5% of it
# (8: within 2.3%, at twice the replay's cost for phub).
UNIT_SPLIT = 4


@dataclass
class Unit:
    """One layer group's messages from one worker to one server (and back): counts per worker."""
    group: int
    server: int
    messages: int  # data messages each way (chunks, or key parts)
    nbytes: int  # payload bytes each way
    part: int = 0  # a big group's chunks travel in several units, each answered on its own


@dataclass
class Group:
    keys: List[int] = field(default_factory=list)
    forward: float = 0.0
    backward: float = 0.0
    nbytes: int = 0


def group_layers(job: Job) -> List[Group]:
    """Consecutive layers merged while a group holds under 1/groups of the bytes and of the
    backward time (forward order; key indices follow the layers' arrays)."""
    total_bytes = sum(4 * e for elements, _, _ in job.layers for e in elements) or 1
    total_back = sum(b for _, _, b in job.layers) or 1.0
    groups, key = [Group()], 0
    for elements, forward, backward in job.layers:
        current = groups[-1]
        nbytes = 4 * sum(elements)
        if current.keys and (current.nbytes + nbytes > total_bytes / job.groups
                             or current.backward + backward > total_back / job.groups):
            current = Group()
            groups.append(current)
        current.keys.extend(range(key, key + len(elements)))
        key += len(elements)
        current.forward += forward
        current.backward += backward
        current.nbytes += nbytes
    return groups


def key_parts(job: Job, servers: int) -> List[List[Tuple[int, int, int]]]:
    """Per key: its (server, messages, payload bytes) parts as the system places them."""
    sizes = [e for elements, _, _ in job.layers for e in elements]
    if job.system in ("phub", "pshard"):
        topology = Topology(interfaces=job.interfaces if job.system == "phub" else 1, cores=job.server_cores,
                            servers=servers)
        plan = ChunkPlan(topology, job.chunk_bytes)
        plan.add_arrays([(k, size) for k, size in enumerate(sizes)])
        parts = []
        for k in range(len(sizes)):
            by_server: Dict[int, List[int]] = {}
            for chunk in plan.key_chunks(k):
                entry = by_server.setdefault(topology.lane_server(chunk.lane), [0, 0])
                entry[0] += 1
                entry[1] += chunk.nbytes
            parts.append([(s, m, b) for s, (m, b) in sorted(by_server.items())])
        return parts
    parts = []
    for k, size in enumerate(sizes):  # MXNet's kvstore_dist: EncodeDefaultKey
        if size < job.bigarray_bound or servers == 1:
            parts.append([((k * 9973) % servers, 1, 4 * size)])
        else:
            edges = [round(size / servers * i) for i in range(servers + 1)]
            parts.append([(s, 1, 4 * (edges[s + 1] - edges[s])) for s in range(servers)])
    return parts


def units_of(job: Job, servers: int, groups: Sequence[Group]) -> List[Unit]:
    if job.system == "gloo-ring":
        return []
    parts = key_parts(job, servers)
    # phub answers chunk by chunk: a group's chunks to one server go in units of at most
    # 1/(groups x UNIT_SPLIT) of the model, so that a big layer's weights start back before
    # all of it is in.
    # ps-lite answers a key part only once all of it is in: its units are whole key parts.
    chunked = job.system in ("phub", "pshard")
    cap = max(job.chunk_bytes, sum(g.nbytes for g in groups) / (job.groups * UNIT_SPLIT)) if chunked else math.inf
    units = []
    for g, group in enumerate(groups):
        merged: Dict[int, List[List[int]]] = {}
        for k in group.keys:
            for s, m, b in parts[k]:
                pieces = merged.setdefault(s, [[0, 0]])
                if chunked and pieces[-1][1] + b > cap and pieces[-1][1]:
                    pieces.append([0, 0])
                if chunked and b > cap:  # one big array: split its chunks evenly into units
                    count = math.ceil(b / cap)
                    for i in range(count):
                        share = [m * (i + 1) // count - m * i // count, b * (i + 1) // count - b * i // count]
                        if pieces[-1][1]:
                            pieces.append([0, 0])
                        pieces[-1] = share
                    continue
                pieces[-1][0] += m
                pieces[-1][1] += b
        for s, pieces in sorted(merged.items()):
            units.extend(Unit(g, s, m, b, i) for i, (m, b) in enumerate(pieces) if m)
    return units


def exchange_counts(job: Job) -> Dict[str, Tuple[float, float]]:
    """Per role, (payload bytes, messages) sent plus received per exchange, summed over the
    role's processes, as the replay charges them: what the software-cost rows should record."""
    n = job.workers
    if job.system == "gloo-ring":
        sends = gloo_segments(sum(4 * e for elements, _, _ in job.layers for e in elements), n)
        moved = (n * 2 * sum(sends), n * 2 * len(sends))
        return {"worker_io": moved, "worker_framework": moved, "server": (0.0, 0)}
    servers = {"phub": 1, "pslite-central": 1}.get(job.system, n)
    parts = [p for key in key_parts(job, servers) for p in key]
    per_part = 4 if job.system.startswith("pslite") else 2
    nbytes = n * 2 * sum(b for _, _, b in parts)
    messages = n * per_part * sum(m for _, m, _ in parts)
    return {role: (nbytes, messages) for role in ("server", "worker_io", "worker_framework")}
