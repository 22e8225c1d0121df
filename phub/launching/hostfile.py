"""Real machines as a Cluster: a hostfile names the nodes, their interfaces and their roles.

    launcher: srun                 # how a command starts on a node: srun (in a SLURM allocation), ssh or local
    pboxes:                        # server nodes: one PBox per rack (several: two-phase reduction)
      - {name: node01, addresses: [10.0.0.1, 10.0.1.1], rack: 0}
    workers:                       # worker nodes, in rank order; `slots`: workers on it (default 1)
      - {name: node02, addresses: [10.0.0.2], rack: 0, slots: 2}
      - {name: node03, addresses: [10.0.0.3], rack: 0}

With `ssh`, every command runs through the remote shell `remote_shell` (a key of the file, or
`phub launch --remote-shell`): a command template whose `{node}` is the node's name and `{address}`
its first address, which runs its last argument, one shell command line, there; the default is
`ssh -o BatchMode=yes {node}`. `ip netns exec {node} sh -c` reaches emulated nodes the same way.

With `srun`, every command runs as a job step on its node (`srun --overlap --nodelist=NAME`,
the caller's environment exported), so this process must run inside the allocation that holds
the nodes, and the Python that runs it must exist at the same path on every node (a shared
filesystem). `local` runs every command on this machine (nodes told apart by their addresses, e.g.
127.x.y.z: what the tests use). `from_slurm` writes a hostfile for the current allocation:
the first nodes become PBoxes, the rest workers, each with the IPv4 addresses of its interfaces.

Every error names the file and the key at fault.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shlex
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..errors import ConfigError
from .cluster import Cluster, Node

LAUNCHERS = ("srun", "ssh", "local")
DEFAULT_REMOTE_SHELL = "ssh -o BatchMode=yes {node}"
_NODE_KEYS = {"name", "addresses", "rack"}
_TOP_KEYS = ("launcher", "remote_shell", "pboxes", "workers")


def launcher_prefix(launcher: str, node: str, remote_shell: str = DEFAULT_REMOTE_SHELL, address: str = "") -> tuple:
    """The argv prefix that runs a command on `node` (`remote_shell`, `address`: for ssh)."""
    if launcher == "local":
        return ()
    if launcher == "srun":
        return ("srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--export=ALL",
                "--kill-on-bad-exit=1", "--quiet")
    if launcher == "ssh":
        return remote_shell_prefix(remote_shell, node, address)
    raise ConfigError(f"launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")


def remote_shell_prefix(template: str, node: str, address: str = "") -> tuple:
    """The words of the remote shell `template` for `node`; ConfigError for an unknown placeholder."""
    try:
        words = tuple(word.format(node=node, address=address) for word in shlex.split(template))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"remote shell {template!r}: {exc} is not a placeholder ({{node}}, {{address}}) "
                          "or the template does not parse") from None
    if not words:
        raise ConfigError("remote shell: the template is empty (e.g. 'ssh -o BatchMode=yes {node}')")
    return words


def parse_hostfile(data: Any, source: str = "<dict>", remote_shell: Optional[str] = None) -> Cluster:
    """A Cluster from a hostfile's content (see the module docstring); ConfigError names the key.
    `remote_shell`: the ssh launcher's template, over the file's own."""
    def error(key: str, message: str) -> ConfigError:
        return ConfigError(f"hostfile {source}: '{key}' {message}")

    if not isinstance(data, Mapping):
        raise ConfigError(f"hostfile {source}: expected a mapping with launcher, pboxes and workers")
    unknown = sorted(set(map(str, data)) - set(_TOP_KEYS))
    if unknown:
        raise error(unknown[0], f"is not a known key (known: {', '.join(_TOP_KEYS)})")
    launcher = data.get("launcher", "srun")
    if launcher not in LAUNCHERS:
        raise error("launcher", f"must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    remote_shell = remote_shell or data.get("remote_shell", DEFAULT_REMOTE_SHELL)
    if not isinstance(remote_shell, str):
        raise error("remote_shell", f"must be a command template such as {DEFAULT_REMOTE_SHELL!r}, "
                    f"got {remote_shell!r}")

    def nodes(role: str) -> List[Node]:
        entries = data.get(role)
        if not isinstance(entries, list) or not entries:
            raise error(role, "must be a non-empty list of nodes ({name, addresses, rack})")
        out = []
        for i, entry in enumerate(entries):
            where = f"{role}[{i}]"
            if not isinstance(entry, Mapping):
                raise error(where, f"must be a mapping with name and addresses, got {entry!r}")
            known = _NODE_KEYS | ({"slots"} if role == "workers" else set())
            extra = sorted(set(map(str, entry)) - known)
            if extra:
                raise error(f"{where}.{extra[0]}", f"is not a known key (known: {', '.join(sorted(known))})")
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
            slots = entry.get("slots", 1)
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
                raise error(f"{where}.slots", f"must be an integer >= 1, got {slots!r}")
            prefix = launcher_prefix(launcher, name, remote_shell, addresses[0])
            out.extend([Node(name, tuple(addresses), prefix, rack, shell=launcher == "ssh")] * slots)
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
        pboxes.append(dataclasses.replace(pbox, addresses=pbox.addresses[:count], rack=r))
    per_rack = workers // racks
    pools = [cluster.workers] if racks == 1 else [[w for w in cluster.workers if w.rack == r] for r in range(racks)]
    chosen = [dataclasses.replace(w, rack=r) for r, pool in enumerate(pools) for w in pool[:per_rack]]
    if len(chosen) < workers:
        where = "" if racks == 1 else f" ({per_rack} in each of racks 0..{racks - 1})"
        raise ConfigError(f"hostfile {source}: the run needs {workers} workers{where}, it lists {len(cluster.workers)}")
    return Cluster(tuple(pboxes), tuple(chosen), hierarchical=racks > 1, extra=cluster.extra)


def load_hostfile(path, remote_shell: Optional[str] = None) -> Cluster:
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
    return parse_hostfile(data, path, remote_shell)


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
