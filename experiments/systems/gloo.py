"""Collective baseline: torch.distributed's gloo allreduce of the whole gradient, then NAG on every worker.

As the paper's Gloo baseline: after backward, the consolidated (flattened) gradient is allreduced
in one call, and every worker runs the same NAG on the sum. The layers' gradients and weights are
views into one flat buffer each, so consolidating costs no copy.

Algorithm: torch's gloo process group has no algorithm option (its AllreduceOptions carry only
the reduce op and a timeout) and calls gloo's generic allreduce, which runs gloo's ring algorithm.
Gloo's halving-doubling allreduce is not reachable from torch 2.13, so only `gloo-ring` exists.

Rendezvous: a TCPStore on worker 0's node (its address, a port probed there); every worker's gloo
device binds its own node's address.
"""
from __future__ import annotations

import datetime
import os
from typing import Dict, Sequence

import numpy as np

from phub.launching.cluster import Cluster
from phub.launching.launch import free_port
from phub.launching.supervisor import Supervisor

from . import System, WorkerSystem


ENV_MASTER, ENV_PORT, ENV_RANK, ENV_WORLD = "GLOO_MASTER_ADDR", "GLOO_MASTER_PORT", "GLOO_RANK", "GLOO_WORLD_SIZE"
ENV_ADDR, ENV_TIMEOUT = "GLOO_NODE_ADDR", "GLOO_TIMEOUT"


class GlooRing(System):
    name = "gloo-ring"
    servers = "none"
    worker_class = "experiments.systems.gloo:GlooWorker"

    def describe(self, cluster: Cluster, options) -> dict:
        return {"servers": 0, "algorithm": "ring (gloo's default; torch exposes no other)"}

    def launch(self, cluster: Cluster, command: Sequence[str], env: Dict[str, str], options, output) -> None:
        master = cluster.workers[0]
        common = {ENV_MASTER: master.addresses[0], ENV_PORT: str(free_port(master)),
                  ENV_WORLD: str(len(cluster.workers)), ENV_TIMEOUT: str(options.time_limit)}
        with Supervisor() as group:
            for rank, node in enumerate(cluster.workers):
                group.start(f"gloo rank {rank} on {node.name}", node.argv(command), output=output,
                            env=dict(env, **common, **{ENV_RANK: str(rank), ENV_ADDR: node.addresses[0]}))
            group.run(options.time_limit)


class GlooWorker(WorkerSystem):
    consolidated = True

    def __init__(self, params: dict):
        import torch
        import torch.distributed as dist
        from torch.distributed import ProcessGroupGloo

        self.torch = torch
        self.rank, self.num_workers = int(os.environ[ENV_RANK]), int(os.environ[ENV_WORLD])
        timeout = datetime.timedelta(seconds=float(os.environ[ENV_TIMEOUT]))
        store = dist.TCPStore(os.environ[ENV_MASTER], int(os.environ[ENV_PORT]), self.num_workers,
                              self.rank == 0, timeout=timeout)
        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(hostname=os.environ[ENV_ADDR])]
        options._timeout = timeout
        self.group = ProcessGroupGloo(store, self.rank, self.num_workers, options)
        self._store = store  # the group keeps using it; keep it alive

    def setup(self, sizes, initial, optimizer) -> None:
        torch = self.torch
        total = int(sum(sizes))
        self._w = torch.zeros(total, dtype=torch.float32)
        self._g = torch.zeros(total, dtype=torch.float32)
        self._mom = torch.zeros(total, dtype=torch.float32)
        w, g = self._w.numpy(), self._g.numpy()
        self._wv, self._gv, offset = [], [], 0
        for size, values in zip(sizes, initial):
            self._wv.append(w[offset:offset + size])
            self._gv.append(g[offset:offset + size])
            self._wv[-1][:] = values
            offset += size
        self.group.broadcast(self._w, 0).wait()  # every worker starts from rank 0's weights
        self._opt = optimizer

    def write_gradient(self, key, values) -> None:
        np.copyto(self._gv[key], values)

    def exchange_all(self) -> None:
        self.group.allreduce([self._g]).wait()  # sum of every worker's gradient, in place
        if self._opt is None:  # breakdown: no_optimizer
            return
        o, g, mom = self._opt, self._g, self._mom
        # NAG in MXNet's formulation (as phub's server runs it), in place on the flat buffers:
        # g = rescale*g + wd*w; mom = momentum*mom + g; g += momentum*mom; w -= lr*g.
        # (torch's scaled adds may fuse a multiply-add: float32 rounding can differ by an ulp.)
        g.mul_(o["rescale_grad"])
        if o["wd"]:
            g.add_(self._w, alpha=o["wd"])
        mom.mul_(o["momentum"]).add_(g)
        g.add_(mom, alpha=o["momentum"])
        self._w.add_(g, alpha=-o["learning_rate"])

    def read_weights(self, key) -> np.ndarray:
        return self._wv[key]

    def close(self) -> None:
        self.group.barrier().wait()  # nobody tears down the store while a peer still needs it
