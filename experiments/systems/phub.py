"""phub as the system under test: one PBox (`phub`) or shards colocated with the workers (`pshard`).

Both start `phub server` processes through `phub.launching.launch.run_job` on the cluster's server nodes
(a PBox node with K interfaces, or one single-interface shard per worker node, whose chunks the
client spreads over all shards) and the workers on its worker nodes.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from phub.launching.cluster import Cluster
from phub.config import JobSpec, ServerConfig
from phub.errors import PHubError

from . import System, WorkerSystem


class PHubSystem(System):
    name = "phub"
    servers = "pbox"
    worker_class = "experiments.systems.phub:PHubWorker"

    def describe(self, cluster: Cluster, options) -> dict:
        return {"servers": len(cluster.servers), "racks": cluster.racks,
                "interfaces": len(cluster.servers[0].addresses), "cores": options.cores,
                "chunk_bytes": options.chunk_bytes, "lanes_per_pair": options.lanes_per_pair,
                "transport": options.transport, "simulated_racks": options.simulated_racks}

    def launch(self, cluster: Cluster, command: Sequence[str], env: Dict[str, str], options, output) -> None:
        from phub.launching.launch import run_job

        config = ServerConfig(jobs=(JobSpec(0, len(cluster.workers)),), cores=options.cores,
                              chunk_bytes=options.chunk_bytes, lanes_per_pair=options.lanes_per_pair,
                              once=True, timeout=options.time_limit, transport=options.transport,
                              simulated_racks=options.simulated_racks)
        job = run_job(list(command), len(cluster.workers), config, cluster=cluster, extra_env=env,
                      stdout=output, stderr=output, time_limit=options.time_limit,
                      torch_vars=False)  # the exchange worker uses no torch.distributed store
        if job.status != 0:
            raise PHubError(f"{self.name}: {job.failed}")


class PShardSystem(PHubSystem):
    name = "pshard"
    servers = "shards"


class PHubWorker(WorkerSystem):
    """A phub client (`phub.connect()` reads the launcher's environment)."""

    def __init__(self, params: dict):
        import phub

        self._phub = phub
        self.kv = phub.connect()
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers

    def setup(self, sizes, initial, optimizer) -> None:
        self._weights = [np.array(a, dtype=np.float32) for a in initial]  # init writes rank 0's values
        self._grads = [None] * len(sizes)
        self._handles = [None] * len(sizes)
        self.kv.init(list(range(len(sizes))), self._weights)
        if optimizer is not None:  # without one the server only sums (breakdown: no_optimizer)
            self.kv.set_optimizer(self._phub.NAG(**optimizer))

    def write_gradient(self, key, values) -> None:
        self._grads[key] = values  # phub pushes from the caller's array: no copy, as a real integration

    def push(self, key) -> None:
        self._handles[key] = self.kv.pushpull_async(key, self._grads[key], out=self._weights[key])

    def wait(self, key) -> None:
        handle, self._handles[key] = self._handles[key], None
        if handle is not None:
            handle.wait()

    def read_weights(self, key) -> np.ndarray:
        return self._weights[key]

    def close(self) -> None:
        self.kv.close()
