"""Stock MXNet 1.9.1 parameter server: the `dist_sync` kvstore over ps-lite (ZeroMQ/TCP).

`pslite-central` runs one server on the cluster's server node; `pslite-shard` runs one server on
each of the cluster's server nodes (one per worker node). The ps-lite scheduler runs on the first
server node. Every process is a real MXNet process started with ps-lite's DMLC_* environment;
servers and the scheduler are `python -c "import mxnet"`, which enters MXNet's server loop by
itself when DMLC_ROLE says so. Each process binds the address of its own node (DMLC_NODE_HOST).

The optimizer runs on the servers (`kv.set_optimizer(mx.optimizer.NAG(...))`, as MXNet does with
`update_on_kvstore`). Arrays of at least MXNET_KVSTORE_BIGARRAY_BOUND elements are split evenly
over the servers; smaller ones go whole to one server (experiments.placement reproduces how).

The big-array bound scales with the model. `--bigarray-bound` (Options.bigarray_bound) is the
bound at the paper's scale, MXNet's default 10^6 elements (4 MB) unless set. On a rack that
divides every array by s_m (its `scale`), the run sets MXNET_KVSTORE_BIGARRAY_BOUND to
max(1, round(bound / s_m)), the same rounding as the arrays (models.scaled_elements), so an array
the paper's MXNet split over all servers is split here too, and one it sent whole goes whole.
Without a scale (loopback, real machines) the bound is used as given. The result row records the
bound the run used (`bigarray_bound`) and the paper-scale one (`bigarray_bound_paper`).

MXNet's quirk: on CPU, a push keeps the pushed array as its communication buffer, so the pull
that follows lands in the *pushed* array (the gradient) and is then copied into `out`. The
gradient array therefore holds weights after each exchange; the replay writes every gradient
anew at backward (as training does), so this needs no extra copy here.
"""
from __future__ import annotations

import sys
from typing import Dict, Optional, Sequence

import numpy as np

from phub.launching.cluster import Cluster
from phub.launching.launch import free_port
from phub.launching.supervisor import Supervisor

from ..models import scaled_elements
from . import System, WorkerSystem


BIGARRAY_BOUND = 1000 * 1000  # elements: MXNet's default MXNET_KVSTORE_BIGARRAY_BOUND


def effective_bigarray_bound(paper_bound: int, scale: Optional[dict]) -> int:
    """The MXNET_KVSTORE_BIGARRAY_BOUND a run uses: `paper_bound` divided by the rack's s_m
    (`scale["model"]`) as an array of that many elements is; unchanged without a scale."""
    return scaled_elements(paper_bound, float((scale or {}).get("model", 1)))


class PSLiteCentral(System):
    name = "pslite-central"
    servers = "pbox"  # one server node (its first interface)
    worker_class = "experiments.systems.pslite:PSLiteWorker"

    def describe(self, cluster: Cluster, options) -> dict:
        return {"servers": len(cluster.servers), "kvstore": "dist_sync",
                "bigarray_bound": effective_bigarray_bound(options.bigarray_bound, cluster.extra.get("scale")),
                "bigarray_bound_paper": options.bigarray_bound}

    def launch(self, cluster: Cluster, command: Sequence[str], env: Dict[str, str], options, output) -> None:
        scheduler = cluster.servers[0]
        common = {
            "DMLC_PS_ROOT_URI": scheduler.addresses[0],
            "DMLC_PS_ROOT_PORT": str(free_port(scheduler)),
            "DMLC_NUM_SERVER": str(len(cluster.servers)),
            "DMLC_NUM_WORKER": str(len(cluster.workers)),
            "MXNET_KVSTORE_BIGARRAY_BOUND": str(self.describe(cluster, options)["bigarray_bound"]),
            "PS_VERBOSE": "0",
        }
        service = [sys.executable, "-c", "import mxnet"]  # MXNet serves on import when DMLC_ROLE says so
        with Supervisor() as group:
            group.start("pslite scheduler", scheduler.argv(service), service=True, output=output,
                        env=dict(common, DMLC_ROLE="scheduler", DMLC_NODE_HOST=scheduler.addresses[0]))
            for s, node in enumerate(cluster.servers):
                group.start(f"pslite server {s} on {node.name}", node.argv(service), service=True, output=output,
                            env=dict(common, DMLC_ROLE="server", DMLC_NODE_HOST=node.addresses[0]))
            for w, node in enumerate(cluster.workers):
                group.start(f"pslite worker on {node.name}", node.argv(command), output=output,
                            env=dict(env, **common, DMLC_ROLE="worker", DMLC_NODE_HOST=node.addresses[0]))
            group.run(options.time_limit)


class PSLiteShard(PSLiteCentral):
    name = "pslite-shard"
    servers = "shards"


class PSLiteWorker(WorkerSystem):
    """A `dist_sync` kvstore worker. ps-lite assigns ranks (in the order workers register)."""

    def __init__(self, params: dict):
        import mxnet as mx

        self.mx = mx
        self.kv = mx.kv.create("dist_sync")
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers

    def setup(self, sizes, initial, optimizer) -> None:
        mx = self.mx
        keys = list(range(len(sizes)))
        self._weights = [mx.nd.array(a, dtype=np.float32) for a in initial]
        self._grads = [mx.nd.zeros(size, dtype=np.float32) for size in sizes]
        self.kv.init(keys, self._weights)  # rank 0's values reach the servers; ends with a barrier
        self.kv.pull(keys, out=self._weights)  # every worker starts from rank 0's values
        mx.nd.waitall()
        if self.rank == 0 and optimizer is not None:  # returns once every server holds the optimizer
            self.kv.set_optimizer(mx.optimizer.NAG(**optimizer))
        self.kv._barrier()  # nobody pushes before the servers have it

    def write_gradient(self, key, values) -> None:
        self._grads[key][:] = values  # synchronous copy; waits for the previous pull into it

    def push(self, key) -> None:
        # Priorities as MXNet's Module sets them: earlier layers (needed first by forward) first.
        self.kv.push(key, self._grads[key], priority=-key)
        self.kv.pull(key, out=self._weights[key], priority=-key)

    def wait(self, key) -> None:
        self._weights[key].wait_to_read()

    def read_weights(self, key) -> np.ndarray:
        return self._weights[key].asnumpy()

    def close(self) -> None:
        # Deleting the kvstore runs MXNet's exit protocol: a barrier, rank 0 stops the servers,
        # and ps-lite finalizes (the scheduler and servers then exit by themselves).
        self.mx.nd.waitall()
        del self.kv
