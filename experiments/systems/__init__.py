"""The systems under test, all real, all driven by the same runner and compute replay.

Each system has two halves:

* a `System` (in the parent process): which servers its cluster needs, and `launch`, which starts
  every process of one run on the nodes of a `phub.launching.cluster.Cluster` (always through
  `node.argv(...)`, with addresses taken from the nodes) and blocks until the workers are done;
* a `WorkerSystem` (inside each worker process): the key-value operations the replay calls.

| name             | servers                       | what runs                                         |
|------------------|-------------------------------|---------------------------------------------------|
| `phub`           | one PBox node, K interfaces   | `phub server` + phub clients                      |
| `pshard`         | one shard per worker node     | `phub server` shards + phub clients               |
| `pslite-central` | one server node               | MXNet 1.9.1 dist_sync kvstore (ps-lite, ZeroMQ)   |
| `pslite-shard`   | one server per worker node    | the same, sharded                                 |
| `gloo-ring`      | none                          | torch.distributed gloo allreduce + NAG per worker |

Modules importing MXNet or torch are imported only when their system is used.
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Sequence

import numpy as np

from phub.launching.cluster import Cluster
from phub.errors import ConfigError

# name -> (module, System class name)
_REGISTRY = {
    "phub": ("experiments.systems.phub", "PHubSystem"),
    "pshard": ("experiments.systems.phub", "PShardSystem"),
    "pslite-central": ("experiments.systems.pslite", "PSLiteCentral"),
    "pslite-shard": ("experiments.systems.pslite", "PSLiteShard"),
    "gloo-ring": ("experiments.systems.gloo", "GlooRing"),
}
SYSTEMS = tuple(_REGISTRY)


class WorkerSystem:
    """One worker's side of a system. Keys are the layout's array indices 0..K-1.

    `rank` and `num_workers` are known after construction (a system may assign ranks itself, as
    ps-lite does). Every method may raise when the system fails; none waits forever: each system
    applies the run's timeout to its blocking calls.
    """

    consolidated = False  # True: one exchange of the whole gradient after backward (allreduce)
    rank: int
    num_workers: int

    def setup(self, sizes: Sequence[int], initial: List[np.ndarray], optimizer: dict) -> None:
        """Register the arrays; blocks until every worker holds rank 0's `initial` weights and the
        NAG optimizer (`optimizer`: learning_rate, momentum, wd, rescale_grad; None: no optimizer,
        the exchange only sums) is in place."""
        raise NotImplementedError

    def write_gradient(self, key: int, values: np.ndarray) -> None:
        """Backward produced `values` as the key's gradient: put them where the system pushes from.
        `values` stays unchanged until the key's `wait` returns, so a system that can push from
        the caller's memory (phub) keeps a reference instead of a copy."""
        raise NotImplementedError

    def push(self, key: int) -> None:
        """Start exchanging the key's gradient; its new weights arrive later (see `wait`)."""

    def wait(self, key: int) -> None:
        """Block until the key's new weights are in place (the next forward of its layer needs them)."""

    def exchange_all(self) -> None:
        """Consolidated systems: exchange the whole gradient and update the weights (blocks)."""

    def read_weights(self, key: int) -> np.ndarray:
        """The key's current weights, as float32 numpy (for verification only, after `wait`)."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the job cleanly (blocks until the system lets this worker go)."""


class System:
    """The launching half of a system (in the parent process)."""

    name = "?"
    servers = "none"  # what the cluster must provide: "pbox", "shards" (one per worker) or "none"
    worker_class = ""  # "module:Class" of its WorkerSystem

    def describe(self, cluster: Cluster, options) -> dict:
        """Facts about this run's setup for the result row (servers, settings)."""
        return {}

    def launch(self, cluster: Cluster, command: Sequence[str], env: Dict[str, str], options, output) -> None:
        """Start the whole system on `cluster` with `command` on every worker node (env added);
        block until every worker has exited 0. Raises PHubError naming the process that failed.
        Worker and server output goes to `output` (a text stream), prefixed with who wrote it."""
        raise NotImplementedError


def get_system(name: str) -> System:
    """The `System` called `name`; ConfigError lists the valid names."""
    if name not in _REGISTRY:
        raise ConfigError(f"--system {name}: unknown system; choose one of {', '.join(SYSTEMS)}")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)()


def worker_system(spec: str, params: dict) -> WorkerSystem:
    """Build the WorkerSystem named by `spec` ("module:Class") inside a worker process."""
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)(params)
