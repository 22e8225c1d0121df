"""Make an emulated rack from its plan (namespaces, bridges, shaped veth links), and check it.

Rules every step keeps (checked by `check_isolation` after the build):
- bridges live in the run's switch namespace and join only veth ends of the run, never a real
  interface; nothing is created, changed or routed in the namespace this process runs in;
- addresses come from 198.18.0.0/15 only (IPv6 is off in every namespace of the run, so no
  link-local address appears), the only routes are the kernel's connected /15 routes (and, on a
  PBox, the same /15 per interface), no default route, no NAT, no forwarding;
- each end of a shaped link has an htb qdisc with one class at the link's rate on its egress, so
  the link is shaped in both directions (this kernel has no netem: no delay is emulated; the
  leaf queue is htb's default FIFO of the device's queue length).
"""
from __future__ import annotations

import ipaddress
from typing import List

from . import netns
from .netns import RackError, ip, tc
from .topology import NETWORK, PREFIX_LEN, Host, Link, Plan

_RANGE = ipaddress.ip_network(NETWORK)
# A PBox has K interfaces on one layer-2 network. Without these, Linux answers ARP for every local
# address on every interface and sends every reply out of the first one, so all traffic would
# share one NIC: answer ARP only on the interface that holds the address (arp_ignore=1), use that
# address as the ARP source (arp_announce=2), and route by source address (see _multihome).
_PBOX_SYSCTLS = {"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2",
                 "net.ipv4.conf.all.rp_filter": "0", "net.ipv4.conf.default.rp_filter": "0"}


def shape(ns: str, dev: str, mbit: float) -> None:
    """Limit the egress of `dev` in `ns` to `mbit` Mbit/s (htb meters whole frames)."""
    rate = f"{max(1, round(mbit * 1000))}kbit"
    tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    tc(ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate,
       "quantum", "1514")


def _add_link(link: Link) -> None:
    low, high = link.lower, link.upper
    peer = ["netns", low.ns] if low.ns != high.ns else []
    ip(high.ns, "link", "add", "name", high.ifname, "type", "veth", "peer", "name", low.ifname, *peer)
    for end in (low, high):
        if end.bridge:
            ip(end.ns, "link", "set", "dev", end.ifname, "master", end.bridge)
        if end.address:
            ip(end.ns, "address", "add", f"{end.address}/{PREFIX_LEN}", "dev", end.ifname)
        if link.rate_mbit is not None:
            shape(end.ns, end.ifname, link.rate_mbit)
        ip(end.ns, "link", "set", "dev", end.ifname, "up")


def _multihome(pbox: Host) -> None:
    """Traffic from NIC k's address leaves through NIC k: one routing table and rule per NIC."""
    for k, address in enumerate(pbox.addresses):
        table = str(100 + k)
        ip(pbox.ns, "rule", "add", "from", address, "table", table, "priority", str(1000 + k))
        ip(pbox.ns, "route", "add", NETWORK, "dev", f"eth{k}", "src", address, "table", table)


def build(plan: Plan) -> None:
    """Create everything in `plan`. On error, raises RackError; the caller removes what was made."""
    for ns in plan.namespaces:
        netns.add_namespace(ns)
    for pbox in plan.pboxes:
        netns.sysctl(pbox.ns, _PBOX_SYSCTLS)
    for bridge in plan.bridges:
        ip(plan.switch_ns, "link", "add", "name", bridge, "type", "bridge", "stp_state", "0")
        ip(plan.switch_ns, "link", "set", "dev", bridge, "up")
    for link in plan.links:
        _add_link(link)
    for pbox in plan.pboxes:
        _multihome(pbox)


def check_isolation(plan: Plan) -> List[str]:
    """Every rule of the module docstring that a namespace of `plan` breaks (empty: none)."""
    problems = []
    for ns in plan.namespaces:
        for line in ip(ns, "-o", "-4", "address", "show").splitlines():
            dev, cidr = line.split()[1], line.split()[3]
            if dev != "lo" and ipaddress.ip_interface(cidr).ip not in _RANGE:
                problems.append(f"{ns}: address {cidr} on {dev} is outside {NETWORK}")
        if ip(ns, "-o", "-6", "address", "show").strip():
            problems.append(f"{ns}: has IPv6 addresses")
        for line in ip(ns, "-4", "route", "show", "table", "all").splitlines():
            words = line.split()
            if words[0] in ("local", "broadcast") or words[:2] == ["127.0.0.0/8", "dev"]:
                continue
            if words[0] != NETWORK:
                problems.append(f"{ns}: route `{line.strip()}` is not within {NETWORK}")
        if netns.run(netns.exec_argv(ns) + ["sysctl", "-n", "net.ipv4.ip_forward"]).strip() != "0":
            problems.append(f"{ns}: forwards IPv4")
    for line in ip(plan.switch_ns, "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name != "lo" and name not in plan.bridges and name not in _switch_ports(plan):
            problems.append(f"{plan.switch_ns}: unexpected interface {name}")
    return problems


def _switch_ports(plan: Plan) -> set:
    return {end.ifname for link in plan.links for end in (link.lower, link.upper) if end.ns == plan.switch_ns}


def verify(plan: Plan) -> None:
    problems = check_isolation(plan)
    if problems:
        raise RackError("the emulated rack breaks its isolation rules: " + "; ".join(problems))
