"""What `phub launch` adds for training on several machines: torch's variables for every worker,
the cluster a hostfile or a SLURM allocation names, starting a process on a remote-shell node,
and the line that says what PHub carried.

torch's variables are the ones `torchrun` sets: RANK and WORLD_SIZE (the job's), LOCAL_RANK and
LOCAL_WORLD_SIZE (among the job's workers on the same host), MASTER_ADDR (the first worker's
first address) and MASTER_PORT (a port free there when the job starts), so that
`torch.distributed.init_process_group("env://")` finds rank 0 on any host.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from .cluster import Cluster, Node
from ..errors import ConfigError

ENV_TORCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _host(node: Node) -> Tuple[str, ...]:
    """What tells hosts apart: the argv prefix that reaches the node (none: this machine)."""
    return node.prefix


def _local_free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def torch_env(members: Sequence[Tuple[int, int]], workers: Sequence[Node], sizes: Dict[int, int],
              free_port=None) -> List[Dict[str, str]]:
    """torch's variables for each worker node, in order: member (job, rank) runs on `workers[i]`,
    job J has `sizes[J]` workers. `free_port(node)` finds MASTER_PORT on a job's first worker
    node (default: `phub.launching.launch.free_port`, probed on the node)."""
    if free_port is None:
        from .launch import free_port as probe_on_node

        def free_port(node: Node) -> int:  # this machine's own nodes: no probe process needed
            return _local_free_port(node.addresses[0]) if not node.prefix else probe_on_node(node)
    first: Dict[int, Node] = {}
    hosts: Dict[Tuple[int, Tuple[str, ...]], List[int]] = {}  # (job, host) -> ranks there
    for (job, rank), node in zip(members, workers):
        first.setdefault(job, node)
        hosts.setdefault((job, _host(node)), []).append(rank)
    masters = {job: (node.addresses[0], free_port(node)) for job, node in first.items()}
    out = []
    for (job, rank), node in zip(members, workers):
        local = hosts[(job, _host(node))]
        address, port = masters[job]
        out.append({"RANK": str(rank), "WORLD_SIZE": str(sizes[job]), "LOCAL_RANK": str(local.index(rank)),
                    "LOCAL_WORLD_SIZE": str(len(local)), "MASTER_ADDR": address, "MASTER_PORT": str(port)})
    return out


def on_node(node: Node, argv: Sequence[str],
            env: Optional[Dict[str, str]]) -> Tuple[List[str], Optional[Dict[str, str]], Optional[bytes]]:
    """How to start `argv` with `env` added on `node`: (argv here, environment to add here, bytes
    for its stdin). A remote-shell node runs `phub.launching.remote`, which reads the command, its
    environment and this directory from stdin; any other node gets the environment directly."""
    if not node.shell:
        return node.argv(argv), env, None
    from .remote import request_line

    forwarded = {name: value for name, value in os.environ.items() if name in FORWARDED or name.startswith("PHUB_")}
    wrapper = node.argv([sys.executable, "-m", "phub.launching.remote"])
    return wrapper, None, request_line(argv, {**forwarded, **(env or {})}, os.getcwd())


# What a remote-shell node gets of this process's environment (with PHUB_*): enough for the same
# Python and import path as here; `--env NAME` in `phub launch` forwards more.
FORWARDED = {"PATH", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS"}


def launch_cluster(hostfile: Optional[str], from_slurm: bool, workers: Optional[int], pboxes: int = 1,
                   interface_regex: Optional[str] = None, remote_shell: Optional[str] = None) -> Cluster:
    """The cluster `phub launch --hostfile FILE` or `--from-slurm` runs on: every worker slot of
    the file (or the allocation's worker nodes), or the first `workers` of them."""
    from . import hostfile as hosts

    if from_slurm:
        cluster = hosts.parse_hostfile(hosts.from_slurm(pboxes, interface_regex), "<from SLURM>")
    else:
        cluster = hosts.load_hostfile(hostfile, remote_shell)
    slots = len(cluster.workers)
    count = slots if workers is None else workers
    if count > slots:
        where = hostfile or "the SLURM allocation"
        raise ConfigError(f"phub launch: -n {count} workers, but {where} has {slots} worker slot(s)")
    return hosts.select(cluster, count, racks=len(cluster.servers))


def carried_line(ended: Sequence[dict], workers: Dict[int, int]) -> Optional[str]:
    """One line from the servers' `ended` events (one per core of each server, for each job that
    ended cleanly): the jobs, their workers (`workers[job]`), the bytes pushed and pulled, the
    rounds (the most any key went through); None when no job ended cleanly."""
    if not ended:
        return None
    jobs = {event.get("job") for event in ended}
    carried = sum(int(event.get("bytes", 0)) for event in ended)
    rounds = max(int(event.get("rounds", 0)) for event in ended)
    return (f"phub: PHub carried {len(jobs)} job(s), {sum(workers.get(job, 0) for job in jobs)} worker(s): "
            f"{_size(carried)} pushed and pulled in {rounds} round(s)")


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit} ({count} bytes)"
    return f"{count} bytes"
