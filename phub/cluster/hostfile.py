"""Real machines as a Cluster: a hostfile names the nodes, their interfaces and their roles.

    launcher: srun                 # how a command starts on a node: srun (in a SLURM allocation) or local
    pboxes:                        # server nodes: one PBox per rack (several: two-phase reduction)
      - {name: node01, addresses: [10.0.0.1, 10.0.1.1], rack: 0}
    workers:                       # worker nodes, in rank order
      - {name: node02, addresses: [10.0.0.2], rack: 0}
      - {name: node03, addresses: [10.0.0.3], rack: 0}

With `srun`, every command runs as a job step on its node (`srun --overlap --nodelist=NAME`,
the caller's environment exported), so this process must run inside the allocation that holds
the nodes, and the Python that runs it must exist at the same path on every node (a shared
filesystem). `local` runs every command on this machine (nodes told apart by their addresses, e.g.
127.x.y.z: what the tests use). `from_slurm` writes a hostfile for the current allocation:
the first nodes become PBoxes, the rest workers, each with the IPv4 addresses of its interfaces.

Every error names the file and the key at fault.
"""
from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..errors import ConfigError
from . import Cluster, Node

LAUNCHERS = ("srun", "local")
_NODE_KEYS = {"name", "addresses", "rack"}


def launcher_prefix(launcher: str, node: str) -> tuple:
    """The argv prefix that runs a command on `node`."""
    if launcher == "local":
        return ()
    if launcher == "srun":
        return ("srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--export=ALL",
                "--kill-on-bad-exit=1", "--quiet")
    raise ConfigError(f"launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")


def parse_hostfile(data: Any, source: str = "<dict>") -> Cluster:
    """A Cluster from a hostfile's content (see the module docstring); ConfigError names the key."""
    def error(key: str, message: str) -> ConfigError:
        return ConfigError(f"hostfile {source}: '{key}' {message}")

    if not isinstance(data, Mapping):
        raise ConfigError(f"hostfile {source}: expected a mapping with launcher, pboxes and workers")
    unknown = sorted(set(map(str, data)) - {"launcher", "pboxes", "workers"})
    if unknown:
        raise error(unknown[0], "is not a known key (known: launcher, pboxes, workers)")
    launcher = data.get("launcher", "srun")
    if launcher not in LAUNCHERS:
        raise error("launcher", f"must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")

    def nodes(role: str) -> List[Node]:
        entries = data.get(role)
        if not isinstance(entries, list) or not entries:
            raise error(role, "must be a non-empty list of nodes ({name, addresses, rack})")
        out = []
        for i, entry in enumerate(entries):
            where = f"{role}[{i}]"
            if not isinstance(entry, Mapping):
                raise error(where, f"must be a mapping with name and addresses, got {entry!r}")
            extra = sorted(set(map(str, entry)) - _NODE_KEYS)
            if extra:
                raise error(f"{where}.{extra[0]}", "is not a known key (known: addresses, name, rack)")
            name = entry.get("name")
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                raise error(f"{where}.name", f"must be a host name, got {name!r}")
            addresses = entry.get("addresses")
            if isinstance(addresses, str):
                addresses = [addresses]
            if not isinstance(addresses, list) or not addresses:
                raise error(f"{where}.addresses", f"must be a non-empty list of IPv4 addresses, got {addresses!r}")
            for address in addresses:
                try:
                    ipaddress.IPv4Address(address)
                except (ipaddress.AddressValueError, ValueError):
                    raise error(f"{where}.addresses", f"{address!r} is not an IPv4 address") from None
            rack = entry.get("rack", 0)
            if isinstance(rack, bool) or not isinstance(rack, int) or rack < 0:
                raise error(f"{where}.rack", f"must be an integer >= 0, got {rack!r}")
            out.append(Node(name, tuple(addresses), launcher_prefix(launcher, name), rack))
        return out

    pboxes, workers = nodes("pboxes"), nodes("workers")
    if [p.rack for p in pboxes] != list(range(len(pboxes))):
        raise error("pboxes", f"PBox r serves rack r: list them in rack order 0, 1, ... (got racks "
                    f"{[p.rack for p in pboxes]})")
    stray = sorted({w.rack for w in workers} - set(range(len(pboxes))))
    if stray:
        raise error("workers", f"rack {stray[0]} has no PBox")
    extra = {"network": "hostfile", "hostfile": source, "launcher": launcher,
             "nodes": {n.name: list(n.addresses) for n in pboxes + workers}}
    return Cluster(tuple(pboxes), tuple(workers), hierarchical=len(pboxes) > 1, extra=extra)


def select(cluster: Cluster, workers: int, interfaces: Optional[int] = None, racks: int = 1) -> Cluster:
    """The part of a hostfile's cluster that one run uses: `racks` PBoxes (the first ones), each
    with its first `interfaces` addresses (default all), and `workers` workers, the first
    workers / racks of each rack (all of rack 0 when there is one rack, whatever their rack)."""
    source = cluster.extra.get("hostfile", "<dict>")
    if racks > len(cluster.servers):
        raise ConfigError(f"hostfile {source}: {racks} racks need {racks} PBoxes, it has {len(cluster.servers)}")
    if workers % racks:
        raise ConfigError(f"{workers} workers do not split evenly over {racks} racks")
    pboxes = []
    for r, pbox in enumerate(cluster.servers[:racks]):
        count = len(pbox.addresses) if interfaces is None else interfaces
        if count > len(pbox.addresses):
            raise ConfigError(f"hostfile {source}: PBox {pbox.name} has {len(pbox.addresses)} addresses, "
                              f"the run asks for {count} interfaces")
        pboxes.append(Node(pbox.name, pbox.addresses[:count], pbox.prefix, r))
    per_rack = workers // racks
    pools = [cluster.workers] if racks == 1 else [[w for w in cluster.workers if w.rack == r] for r in range(racks)]
    chosen = [Node(w.name, w.addresses, w.prefix, r) for r, pool in enumerate(pools) for w in pool[:per_rack]]
    if len(chosen) < workers:
        where = "" if racks == 1 else f" ({per_rack} in each of racks 0..{racks - 1})"
        raise ConfigError(f"hostfile {source}: the run needs {workers} workers{where}, it lists {len(cluster.workers)}")
    return Cluster(tuple(pboxes), tuple(chosen), hierarchical=racks > 1, extra=cluster.extra)


def load_hostfile(path) -> Cluster:
    """parse_hostfile on a YAML or JSON file."""
    import yaml

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"hostfile {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"hostfile {path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"hostfile {path}: not valid YAML: {exc}") from None
    return parse_hostfile(data, path)


def _run(argv: Sequence[str], what: str, timeout: float = 60.0) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ConfigError(f"{what}: `{argv[0]}` is not installed (SLURM's client commands are needed)") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what}: `{' '.join(argv)}` did not answer within {timeout:g} s") from None
    if proc.returncode != 0:
        raise ConfigError(f"{what}: `{' '.join(argv)}` failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def interface_addresses(ip_output: str, pattern: Optional[str] = None) -> List[str]:
    """IPv4 addresses from `ip -o -4 address show`: every interface but loopback, or those whose
    name matches `pattern` (a regular expression; `lo` must be asked for by name)."""
    out = []
    for line in ip_output.splitlines():
        words = line.split()
        if len(words) < 4 or words[2] != "inet":
            continue
        dev, address = words[1], words[3].split("/")[0]
        if pattern is None and (dev == "lo" or address.startswith("127.")):
            continue
        if pattern is not None and not re.fullmatch(pattern, dev):
            continue
        out.append(address)
    return out


def from_slurm(pboxes: int = 1, interfaces: Optional[str] = None,
               environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The hostfile of the SLURM allocation this process runs in (its content, for `parse_hostfile`
    or writing out): the first `pboxes` nodes are PBoxes (PBox r serves rack r), the others
    workers, split evenly over the racks. Each node's addresses are read on the node itself (one
    `srun` step per node running `ip -o -4 address show`), filtered by `interfaces`."""
    env = os.environ if environ is None else environ
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError("hostfile from SLURM: not inside a SLURM allocation (SLURM_JOB_NODELIST is unset); "
                          "run it in a job (sbatch/salloc) or write the hostfile by hand")
    names = _run(["scontrol", "show", "hostnames", nodelist], "hostfile from SLURM").split()
    if len(names) <= pboxes:
        raise ConfigError(f"hostfile from SLURM: the allocation has {len(names)} node(s) ({', '.join(names)}); "
                          f"{pboxes} PBox(es) and at least one worker need {pboxes + 1}")
    addresses = {}
    for name in names:
        shown = _run([*launcher_prefix("srun", name), "ip", "-o", "-4", "address", "show"],
                     f"hostfile from SLURM: node {name}")
        addresses[name] = interface_addresses(shown, interfaces)
        if not addresses[name]:
            which = f"matching {interfaces!r}" if interfaces else "besides loopback"
            raise ConfigError(f"hostfile from SLURM: node {name} has no IPv4 interface {which}")
    return assign_roles(names, addresses, pboxes)


def assign_roles(names: Sequence[str], addresses: Mapping[str, List[str]], pboxes: int) -> Dict[str, Any]:
    """A hostfile's content (launcher srun) for nodes `names`: the first `pboxes` are PBoxes (PBox r
    serves rack r), the others workers, split evenly over the racks in order."""
    workers = list(names[pboxes:])
    if pboxes < 1 or not workers or len(workers) % pboxes:
        raise ConfigError(f"hostfile from SLURM: {len(workers)} worker node(s) do not split evenly over "
                          f"{pboxes} rack(s) (nodes: {', '.join(names)})")
    per_rack = len(workers) // pboxes
    return {"launcher": "srun",
            "pboxes": [{"name": n, "addresses": list(addresses[n]), "rack": r} for r, n in enumerate(names[:pboxes])],
            "workers": [{"name": n, "addresses": list(addresses[n]), "rack": i // per_rack}
                        for i, n in enumerate(workers)]}
