"""`phub doctor`: what this machine has, and which phub transports and experiment modes can run.

It looks, and changes nothing: the network-namespace check runs in a throwaway namespace that
disappears with the check's process. Every probe turns its failure into a sentence; nothing here
raises except `require_transport`, which is how choosing a transport fails at start.

`collect()` returns the report as a dict (what `phub doctor --json` prints):

    python       {"version"}
    cpu          {"count": os.cpu_count(), "usable": CPUs this process may run on,
                  "numa_nodes": [{"node", "cpus"}]}
    interfaces   [{"name", "operstate", "mtu", "speed_mbps" (null if the driver reports none)}]
    privileges   {"cap_net_admin": bool or null, "netns": bool, "netns_detail": str}
    rdma         see phub.network.rdma.verbs.probe()
    libraries    {"numpy": version or null, "mxnet": ..., "torch": ...}   (null: not installed)
    transports   {"tcp": {"available", "reason"}, "verbs": {"available", "hardware", "reason"},
                  "soft-verbs": {"available", "reason"}}
    modes        {"loopback": {"available", "reason"}, "emulated_rack": {"available", "reason"}}
"""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
from typing import Dict, List, Optional

from ..config import TRANSPORTS
from ..errors import ConfigError

CAP_NET_ADMIN = 12  # bit number in the capability sets of /proc/<pid>/status
LIBRARIES = ("numpy", "mxnet", "torch")
# Everything the emulated rack needs, tried inside a private network namespace (gone on exit):
# a veth pair and an htb qdisc, the two things its links are made of.
_RACK_CHECK = "ip link add phubdoc0 type veth peer name phubdoc1 && tc qdisc add dev phubdoc0 root handle 1: htb"


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:  # absent, or the driver refuses (e.g. `speed` of a virtual interface)
        return None


def cpu_info() -> dict:
    nodes = []
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*"), key=lambda p: int(p.rsplit("node", 1)[1])):
        nodes.append({"node": int(path.rsplit("node", 1)[1]), "cpus": _read(os.path.join(path, "cpulist")) or ""})
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {"count": os.cpu_count(), "usable": usable, "numa_nodes": nodes}


def interfaces() -> List[dict]:
    out = []
    for path in sorted(glob.glob("/sys/class/net/*")):
        speed = _read(os.path.join(path, "speed"))
        mtu = _read(os.path.join(path, "mtu"))
        speed_mbps = int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None
        out.append({"name": os.path.basename(path), "operstate": _read(os.path.join(path, "operstate")),
                    "mtu": int(mtu) if mtu and mtu.isdigit() else None, "speed_mbps": speed_mbps})
    return out


def cap_net_admin() -> Optional[bool]:
    """Whether this process holds CAP_NET_ADMIN (None if the kernel does not say)."""
    status = _read("/proc/self/status") or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    return None


def _try(command: List[str]) -> Optional[str]:
    """Run a short check; None if it succeeded, else one line saying why not."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{command[0]}: {exc}"
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"{command[0]} exited with status {proc.returncode}"


def netns() -> dict:
    """Whether a network namespace can be created (tried in a throwaway one)."""
    if not shutil.which("unshare"):
        return {"available": False, "detail": "the unshare tool (util-linux) is not installed"}
    failure = _try(["unshare", "--net", "true"])
    return {"available": failure is None, "detail": failure or "a private network namespace was created"}


def libraries() -> Dict[str, Optional[str]]:
    """Installed versions, without importing anything that has package metadata."""
    versions: Dict[str, Optional[str]] = {}
    for name in LIBRARIES:
        if importlib.util.find_spec(name) is None:
            versions[name] = None
            continue
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # e.g. built from source: ask the module
            try:
                versions[name] = str(getattr(__import__(name), "__version__", "unknown"))
            except Exception as exc:
                versions[name] = f"present but fails to import ({type(exc).__name__})"
    return versions


def loopback() -> dict:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(1)
    except OSError as exc:
        return {"available": False, "reason": f"cannot listen on 127.0.0.1: {exc}"}
    return {"available": True, "reason": None}


def verbs_transport(rdma: dict) -> dict:
    """Whether the verbs transport can run, from `phub.network.rdma.verbs.probe()`'s report, and why not."""
    if rdma["reason"]:
        return {"available": False, "hardware": False, "reason": rdma["reason"]}
    return {"available": True, "hardware": True, "reason": None}


def soft_verbs() -> dict:
    """The software RDMA provider needs abstract Unix sockets (Linux)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(b"\0phub-doctor-%d" % os.getpid())
    except (OSError, AttributeError) as exc:
        return {"available": False, "reason": f"no abstract Unix sockets here: {exc}"}
    return {"available": True, "reason": None}


def emulated_rack(privileges: dict) -> dict:
    missing = [tool for tool in ("unshare", "ip", "tc") if not shutil.which(tool)]
    if missing:
        return {"available": False, "reason": f"missing tool(s): {', '.join(missing)} (iproute2, util-linux)"}
    if privileges["cap_net_admin"] is False:
        return {"available": False, "reason": "this process lacks CAP_NET_ADMIN (run as root or grant it)"}
    if not privileges["netns"]:
        return {"available": False, "reason": f"network namespaces cannot be created: {privileges['netns_detail']}"}
    failure = _try(["unshare", "--net", "sh", "-c", _RACK_CHECK])
    if failure:
        return {"available": False, "reason": f"a veth pair with an htb qdisc cannot be made: {failure}"}
    return {"available": True, "reason": None}


def collect() -> dict:
    """The whole report (see the module docstring). Takes well under a second; never raises."""
    from ..network.rdma.verbs import probe

    ns = netns()
    privileges = {"cap_net_admin": cap_net_admin(), "netns": ns["available"], "netns_detail": ns["detail"]}
    rdma = probe()
    lo = loopback()
    return {
        "python": {"version": platform.python_version()},
        "cpu": cpu_info(),
        "interfaces": interfaces(),
        "privileges": privileges,
        "rdma": rdma,
        "libraries": libraries(),
        "transports": {"tcp": dict(lo), "verbs": verbs_transport(rdma), "soft-verbs": soft_verbs()},
        "modes": {"loopback": dict(lo), "emulated_rack": emulated_rack(privileges)},
    }


def require_transport(transport: str) -> None:
    """Raise ConfigError, with the doctor's explanation, unless `transport` can run here."""
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    if transport != "verbs":  # tcp, and soft-verbs (software only) run wherever phub runs
        return
    from ..network.rdma.verbs import probe

    status = verbs_transport(probe())
    if not status["available"]:
        raise ConfigError(f"transport 'verbs' cannot run here: {status['reason']} (`phub doctor` tells more)")


def _yes(entry: dict) -> str:
    return "yes" if entry["available"] else f"no: {entry['reason']}"


def render(report: dict) -> str:
    """The report as text for a person."""
    cpu = report["cpu"]
    nodes = "; ".join(f"node{n['node']}: cpus {n['cpus']}" for n in cpu["numa_nodes"]) or "not reported"
    nics = []
    for nic in report["interfaces"]:
        speed = f"{nic['speed_mbps']} Mb/s" if nic["speed_mbps"] else "speed not reported"
        nics.append(f"    {nic['name']:<12} {nic['operstate'] or '?':<8} mtu {nic['mtu'] or '?':<6} {speed}")
    priv = report["privileges"]
    cap = {True: "yes", False: "no", None: "unknown"}[priv["cap_net_admin"]]
    rdma = report["rdma"]
    devices = []
    for dev in rdma["devices"]:
        ports = ", ".join(f"port {p['port']} {'ACTIVE' if p['active'] else 'down'} {p['link_layer']} mtu {p['mtu']}"
                          for p in dev["ports"]) or dev.get("error") or "no ports"
        devices.append(f"    {dev['name']}: {ports}")
    libs = ", ".join(f"{name} {version}" if version else f"{name} not installed"
                     for name, version in report["libraries"].items())
    lines = [
        f"python       {report['python']['version']}",
        f"cpu          {cpu['count']} cores ({cpu['usable']} usable by this process); "
        f"{len(cpu['numa_nodes']) or '?'} NUMA node(s): {nodes}",
        "interfaces",
        *nics,
        f"privileges   CAP_NET_ADMIN: {cap}; network namespaces: "
        f"{'can be created' if priv['netns'] else 'cannot be created (' + priv['netns_detail'] + ')'}",
        f"rdma         pyverbs {'loads' if rdma['pyverbs'] else 'does not load'}; "
        f"{len(rdma['devices'])} device(s)" + (f"; {rdma['reason']}" if rdma["reason"] else ""),
        *devices,
        f"libraries    {libs}",
        "",
        "transports",
        f"    tcp            {_yes(report['transports']['tcp'])}",
        f"    verbs          {_yes(report['transports']['verbs'])}",
        f"    soft-verbs     {_yes(report['transports']['soft-verbs'])}  (the verbs data path in software, for tests)",
        "experiment modes",
        f"    loopback       {_yes(report['modes']['loopback'])}",
        f"    emulated rack  {_yes(report['modes']['emulated_rack'])}",
    ]
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    report = collect()
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
