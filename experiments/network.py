"""Where a run's processes go: `--network NAME` picks a function that builds the run's Cluster.

A network function takes (system name, number of workers, options) and returns a
`phub.launching.cluster.Cluster` whose nodes fit the system's needs (`get_system(name).servers`):

* "pbox":   one server node (phub: a PBox with `options.num_interfaces` interfaces, one per rack
            when `options.racks` > 1; pslite-central: its server and scheduler),
* "shards": one server node per worker node (phub shards, or ps-lite servers),
* "none":   worker nodes only; the cluster's (unused) server node is ignored.

It may instead return a context manager that yields the Cluster, for networks that must be set
up and torn down around the run (the emulated rack's namespaces and links). Networks are listed
in NETWORKS; `emulated_cluster` serves `--network emulated --spec FILE` (the emulated rack of
`experiments.rack.emulated`), `hostfile_cluster` `--network hostfile --spec FILE` (real machines,
phub.launching.hostfile). Whatever the cluster records in its `extra` dict (link rates, scale
factors) is copied into every result row.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict

from phub.launching.cluster import Cluster, loopback
from phub.errors import ConfigError

from .systems import get_system


def loopback_cluster(system: str, workers: int, options) -> Cluster:
    """Every node on this machine, told apart by 127.x.y.z addresses; no shaping."""
    servers = get_system(system).servers
    if system != "phub":  # `num_interfaces` is the PBox's; the baselines use one address per node
        if options.racks != 1:
            raise ConfigError(f"--racks applies to --system phub only, not {system}")
        return loopback(workers, shards=workers if servers == "shards" else 0)
    return loopback(workers, interfaces=options.num_interfaces, racks=options.racks)


@contextlib.contextmanager
def emulated_cluster(system: str, workers: int, options):
    """The emulated rack described by `options.spec` (network namespaces, shaped links), up for
    the run and torn down after it, however it ends; the cluster is `emulated_view`'s."""
    from experiments.rack.emulated import EmulatedRack

    if not options.spec:
        raise ConfigError("--network emulated needs --spec FILE (an emulated rack spec)")
    rack = EmulatedRack(options.spec)
    with rack as cluster:
        if len(cluster.workers) != workers:
            raise ConfigError(f"--workers {workers}, but the rack spec {options.spec} has {len(cluster.workers)} "
                              "worker nodes (racks x workers_per_rack)")
        yield emulated_view(rack, system)


def emulated_view(rack, system: str) -> Cluster:
    """The nodes of an emulated rack that is up, as `system` uses them: phub on the PBoxes (one
    per rack: two-phase reduction), shards on the worker nodes, ps-lite's central server on the
    first PBox; gloo uses the worker nodes only. One rack serves every system this way."""
    cluster = rack.cluster
    servers = get_system(system).servers
    if servers == "shards":
        return rack.sharded_cluster()
    if system == "phub" or not cluster.hierarchical:
        return cluster
    return Cluster(cluster.servers[:1], cluster.workers, hierarchical=False, extra=cluster.extra)


def hostfile_cluster(system: str, workers: int, options) -> Cluster:
    """Real machines named by the hostfile `options.spec` (see phub.launching.hostfile): the run
    takes the first `workers` workers and, for phub, `options.racks` PBoxes with
    `options.num_interfaces` addresses each. Roles go where the emulated rack puts them: phub on the
    PBoxes, shards on the worker nodes, ps-lite's central server on the first PBox, gloo on the
    worker nodes only."""
    from phub.launching.hostfile import load_hostfile, select

    if not options.spec:
        raise ConfigError("--network hostfile needs --spec FILE (a hostfile)")
    servers = get_system(system).servers
    if system != "phub" and options.racks != 1:
        raise ConfigError(f"--racks applies to --system phub only, not {system}")
    cluster = select(load_hostfile(options.spec), workers, options.num_interfaces if system == "phub" else 1,
                     options.racks)
    return cluster.sharded() if servers == "shards" else cluster


NETWORKS: Dict[str, Callable] = {"loopback": loopback_cluster, "emulated": emulated_cluster,
                                 "hostfile": hostfile_cluster}


@contextlib.contextmanager
def cluster_for(system: str, workers: int, options):
    """Yield the Cluster of one run on `options.network` (set up and torn down around the run)."""
    build = NETWORKS.get(options.network)
    if build is None:
        raise ConfigError(f"--network {options.network}: unknown network; choose one of {', '.join(NETWORKS)}")
    made = build(system, workers, options)
    if isinstance(made, Cluster):
        yield made
    else:
        with made as cluster:
            yield cluster
