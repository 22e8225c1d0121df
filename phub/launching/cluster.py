"""Where a job's processes run: nodes with addresses, and how to start a command on each.

A `Cluster` names one server node (a PBox) per rack, or one per worker for a sharded server, and
the worker nodes. A node runs commands through an argv prefix: empty on this machine (loopback),
`ip netns exec NS` inside an emulated rack (see `experiments.rack.emulated`), `srun -w HOST` on SLURM,
or a remote shell (`ssh HOST`: a `shell` node, whose prefix takes one shell command line and
passes no environment; the launcher wraps its commands, see `phub.launching.remote`).
The launcher only ever calls `Node.argv`, so every placement starts processes the same way.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

from ..errors import ConfigError


@dataclass(frozen=True)
class Node:
    name: str
    addresses: Tuple[str, ...]  # the node's interfaces; a server listens on all of them
    prefix: Tuple[str, ...] = ()  # argv prefix that runs a command on this node
    rack: int = 0
    shell: bool = False  # the prefix runs its last argument, one shell command line (ssh HOST)

    def __post_init__(self):
        object.__setattr__(self, "addresses", tuple(self.addresses))
        object.__setattr__(self, "prefix", tuple(self.prefix))
        if not self.addresses:
            raise ConfigError(f"node {self.name!r} has no address")

    def argv(self, argv: Sequence[str]) -> List[str]:
        if self.shell:
            return [*self.prefix, shlex.join(argv)]
        return [*self.prefix, *argv]


@dataclass(frozen=True)
class Cluster:
    """Server and worker nodes. `hierarchical`: one PBox per rack, two-phase reduction between
    them; otherwise every worker uses every server (one PBox, or shards on the worker nodes)."""

    servers: Tuple[Node, ...]
    workers: Tuple[Node, ...]
    hierarchical: bool = False
    extra: dict = field(default_factory=dict, compare=False)  # facts recorded with results (rates, ...)

    def __post_init__(self):
        object.__setattr__(self, "servers", tuple(self.servers))
        object.__setattr__(self, "workers", tuple(self.workers))
        if not self.servers or not self.workers:
            raise ConfigError("a cluster needs at least one server node and one worker node")
        if self.hierarchical:
            racks = sorted({w.rack for w in self.workers})
            if racks != list(range(len(self.servers))):
                raise ConfigError(f"hierarchical cluster: workers sit in racks {racks}, "
                                  f"but there are {len(self.servers)} rack servers")

    @property
    def racks(self) -> int:
        return len(self.servers) if self.hierarchical else 1

    def sharded(self) -> "Cluster":
        """The same nodes with a server shard on every worker node instead of the PBoxes (PShard,
        ps-lite's sharded servers)."""
        shards = tuple(Node(f"shard{g}", w.addresses, w.prefix, rack=w.rack, shell=w.shell)
                       for g, w in enumerate(self.workers))
        return Cluster(shards, self.workers, hierarchical=False, extra=self.extra)

    def servers_of(self, worker: int) -> Tuple[Node, ...]:
        """The server(s) worker `worker` connects to."""
        if self.hierarchical:
            return (self.servers[self.workers[worker].rack],)
        return self.servers


def loopback(num_workers: int, interfaces: int = 1, racks: int = 1, shards: int = 0) -> Cluster:
    """Every node on this machine, told apart by 127.0.0.0/8 addresses (no shaping).

    `shards` > 0 gives a sharded server (one single-interface shard per node, like PShard) instead
    of one PBox with `interfaces` interfaces; `racks` > 1 gives one PBox per rack, hierarchical.
    """
    if num_workers < 1 or interfaces < 1 or racks < 1 or shards < 0:
        raise ConfigError("loopback cluster: counts must be positive")
    if racks > 1 and num_workers % racks:
        raise ConfigError(f"{num_workers} workers do not split evenly over {racks} racks")
    per_rack = num_workers // racks
    workers = tuple(Node(f"worker{w}", (f"127.1.{w // 250}.{w % 250 + 1}",), rack=w // per_rack)
                    for w in range(num_workers))
    if shards:
        servers = tuple(Node(f"shard{s}", (f"127.2.{s // 250}.{s % 250 + 1}",)) for s in range(shards))
        return Cluster(servers, workers)
    servers = tuple(Node(f"pbox{r}", tuple(f"127.3.{r}.{i + 1}" for i in range(interfaces)), rack=r)
                    for r in range(racks))
    return Cluster(servers, workers, hierarchical=racks > 1)
