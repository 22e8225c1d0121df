"""Thin wrappers around `ip` and `tc` for the emulated rack, and the privilege check.

Every call names the namespace it acts in (`ip -n NS`, `tc -n NS`); nothing here touches the
namespace this process runs in. A failing command raises RackError quoting the command and the
tool's own message.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import time
from typing import Dict, Iterable, List, Optional, Sequence

from phub.errors import PHubError

CAP_NET_ADMIN = 12  # bit in /proc/self/status CapEff
TOOLS = ("ip", "tc")


class RackError(PHubError):
    """The emulated rack could not be built, measured or removed; the message says which part."""


def run(argv: Sequence[str], timeout: float = 20.0, stdin: Optional[str] = None) -> str:
    """Run a command to completion (fed `stdin`); its stdout, or RackError with its stderr."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=stdin)
    except FileNotFoundError:
        raise RackError(f"`{argv[0]}` is not installed (the emulated rack needs iproute2: ip, tc)") from None
    except subprocess.TimeoutExpired:
        raise RackError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().replace("\n", "; ")
        raise RackError(f"`{' '.join(argv)}` failed: {message or f'status {proc.returncode}'}")
    return proc.stdout


def ip(ns: str, *args: str) -> str:
    return run(["ip", "-n", ns, *args])


def tc(ns: str, *args: str) -> str:
    return run(["tc", "-n", ns, *args])


def tc_batch(ns: str, commands: Sequence[str]) -> None:
    """Run several tc commands (one per line, without the leading `tc`) in one process."""
    run(["tc", "-n", ns, "-batch", "-"], stdin="\n".join(commands) + "\n")


def exec_argv(ns: str) -> List[str]:
    """The argv prefix that runs a command inside namespace `ns`."""
    return ["ip", "netns", "exec", ns]


def sysctl(ns: str, settings: Dict[str, str]) -> None:
    """Set sysctls of namespace `ns` (keys whose file is absent, e.g. without IPv6, are skipped)."""
    present = [f"{k}={v}" for k, v in settings.items() if os.path.exists("/proc/sys/" + k.replace(".", "/"))]
    if present:
        run(exec_argv(ns) + ["sysctl", "-q", "-w", *present])


def list_namespaces() -> List[str]:
    out = run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


# The emulated hosts' TCP, the same on every machine whatever the machine's own default: reno is
# built into every kernel and always allowed in a namespace (other algorithms may be neither).
# A default of BBR (as here) would make results drift: each BBR flow drains its cwnd to 4 packets
# for 200 ms every 10 s (ProbeRTT), which on 8 x 8 flows coupled by the parameter server slowed
# every exchange that hit one by 30%.
TCP_CONGESTION = "reno"


def add_namespace(ns: str) -> None:
    """A fresh namespace with IPv6 off (so no address outside 198.18.0.0/15 appears), the emulated
    hosts' TCP congestion control, and lo up."""
    run(["ip", "netns", "add", ns])
    sysctl(ns, {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1",
                "net.ipv4.tcp_congestion_control": TCP_CONGESTION})
    ip(ns, "link", "set", "lo", "up")


def namespace_pids(ns: str) -> List[int]:
    try:
        out = run(["ip", "netns", "pids", ns])
    except RackError:
        return []  # the namespace is gone
    return [int(p) for p in out.split() if p.isdigit()]


def _pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, AttributeError, OSError):
        return None


def stop_processes(pids: Iterable[int], grace: float = 3.0) -> List[int]:
    """SIGTERM `pids`, wait (on pidfds) up to `grace` s, SIGKILL the rest; the pids that were killed."""
    fds = {}
    for pid in pids:
        fd = _pidfd(pid)
        if fd is None:
            continue
        fds[pid] = fd
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    poller = select.poll()
    for fd in fds.values():
        poller.register(fd, select.POLLIN)
    alive = dict(fds)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            poller.unregister(fd)
            alive = {p: f for p, f in alive.items() if f != fd}
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid, fd in fds.items():  # a killed process is gone once its pidfd reads ready
        if pid in alive:
            select.select([fd], [], [], grace)
        os.close(fd)
    return sorted(fds)


def delete_namespace(ns: str) -> List[int]:
    """Stop every process inside `ns`, then delete it; the pids that were stopped."""
    stopped = stop_processes(namespace_pids(ns))
    left = namespace_pids(ns)
    if left:
        stopped += stop_processes(left)  # started while the first ones were stopping
    run(["ip", "netns", "delete", ns])
    return stopped


def cap_net_admin() -> Optional[bool]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return None


def user_namespace_detail() -> Optional[str]:
    """None if an unprivileged user + network namespace can be made here, else why not."""
    if not shutil.which("unshare"):
        return "the `unshare` tool (util-linux) is not installed"
    try:
        proc = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "true"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare: {exc}"
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"unshare exited with {proc.returncode}")


def privilege_problem(in_user_namespace: bool = False) -> Optional[str]:
    """None if this process can build a rack; otherwise what is missing and how to run instead."""
    missing = [tool for tool in TOOLS + ("sysctl",) if not shutil.which(tool)]
    if missing:
        return (f"the emulated rack needs {', '.join(missing)} (iproute2, procps), which is not installed; "
                "install it, or use `network: loopback` (unshaped)")
    if cap_net_admin():
        return None
    where = "inside its user namespace" if in_user_namespace else "this process"
    detail = user_namespace_detail()
    if detail is None:
        return (f"{where} lacks CAP_NET_ADMIN, which creating namespaces, bridges and qdiscs needs. Unprivileged "
                "user namespaces work here: `python -m experiments rack up` re-runs itself inside one (the rack then lives as long "
                "as that command); from Python, call experiments.rack.emulated.reexec_unprivileged() first, run as "
                "root, or use `network: loopback` (unshaped)")
    return (f"{where} lacks CAP_NET_ADMIN, and an unprivileged user + network namespace cannot be made either "
            f"({detail}). Run as root (or grant CAP_NET_ADMIN and CAP_SYS_ADMIN), or use `network: loopback`, "
            "which runs on 127.0.0.0/8 without shaping")


USERNS_ENV = "PHUB_RACK_USERNS"  # set inside the user namespace made by reexec_argv
# Inside a fresh user + mount namespace: a private /run (so `ip netns` can keep its mount points
# and the rack its state), then the original command.
_USERNS_SETUP = "mount -t tmpfs phub-rack /run && mkdir -p /run/netns /run/phub && exec \"$@\""


def reexec_argv(argv: Sequence[str]) -> List[str]:
    """`argv`, run inside a new user namespace (mapped to root), network and mount namespace."""
    return ["unshare", "--user", "--map-root-user", "--net", "--mount", "--propagation", "private",
            "sh", "-c", _USERNS_SETUP, "phub-rack", *argv]
