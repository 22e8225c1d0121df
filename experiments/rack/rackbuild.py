"""Make an emulated rack from its plan (namespaces, bridges, shaped veth links), and check it.

Rules every step keeps (checked by `check_isolation` after the build):
- bridges live in the run's switch namespace and join only veth ends of the run, never a real
  interface; nothing is created, changed or routed in the namespace this process runs in;
- addresses come from 198.18.0.0/15 only (IPv6 is off in every namespace of the run, so no
  link-local address appears), the only routes are the kernel's connected /15 routes (and, on a
  PBox, the same /15 per interface), no default route, no NAT, no forwarding;
- each end of a shaped link has an htb qdisc on its egress whose root class runs at the link's
  rate, so the link is shaped in both directions (this kernel has no netem: no delay is emulated).
  Below the root, `shaping_commands` says how the queue is shared (see `QUEUEING`).
"""
from __future__ import annotations

import ipaddress
from typing import List

from . import netns
from .netns import RackError, ip
from .rackspec import QUEUEING
from .topology import NETWORK, PREFIX_LEN, Host, Link, Plan

_RANGE = ipaddress.ip_network(NETWORK)
# A PBox has K interfaces on one layer-2 network. Without these, Linux answers ARP for every local
# address on every interface and sends every reply out of the first one, so all traffic would
# share one NIC: answer ARP only on the interface that holds the address (arp_ignore=1), use that
# address as the ARP source (arp_announce=2), and route by source address (see _multihome).
_PBOX_SYSCTLS = {"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2",
                 "net.ipv4.conf.all.rp_filter": "0", "net.ipv4.conf.default.rp_filter": "0"}


# QUEUEING (rackspec): "fair" stands in for the fair queueing (fq_codel, fq) a real host runs and
# this kernel lacks:
# - pure ACKs go first. Without that, the ACKs of one direction wait behind the other direction's
#   data queue, and a worker pushing and pulling at once gets far less than its link (measured: a
#   duplex transfer took 1.05..1.5 x its wire time with one FIFO, a steady 1.05 x with ACKs first);
# - the rest is shared round-robin among `buckets` classes chosen by the low bits of the peer's
#   address (destination on a node's egress, source on a switch port's egress), so a worker's
#   flows to K PBox NICs, or K NICs' flows into one worker, progress side by side instead of in
#   arrival order. Addresses within a rack differ in their last octet, so a rack's peers share no
#   bucket when there are as many buckets as peers (`Plan.fair_buckets`). Each bucket is
#   guaranteed an equal part of the link: htb keeps rates well when busy classes run on their own
#   guarantee, worse when they borrow (measured on 8 workers x 8 NICs: 16 buckets, half of them
#   borrowing, made an exchange 20% slower than 8).
# - on a PBox's links when there are several racks (`link_roles`), the buckets are doubled by the
#   peer's role, worker (198.18/16) or PBox (198.19/16): NIC k of every PBox and worker k of every
#   rack end in the same octet, so with one set of buckets the racks' partials and totals would
#   wait in worker k's queue behind its pushes or results, which they gate (measured, AlexNet on 2
#   racks of 2 workers at 10 Gbps, alternated, medians of 3: 1.37-1.43 x its floor with one set,
#   1.17-1.20 x with the roles apart). Single-rack plans keep one set.
# "fifo" is htb's default single FIFO (the device's queue length), as in earlier results.
# The ACK class is guaranteed 1/_ACK_SHARE of the link (and may borrow the rest): about what the
# ACKs of a full-rate transfer the other way take (one 66-byte ACK per two 1448-byte segments is
# 2.3%), so the data buckets run on their own guarantee rather than borrowing (a tenth for ACKs
# left each bucket 10% to borrow: an exchange on 8 workers x 8 NICs took 1.17 x its wire bound
# instead of 1.12 x).
_ACK_SHARE = 40
_TCP_ACK_ONLY = ("match ip protocol 6 0xff match u8 0x05 0x0f at 0 match u16 0x0000 0xff80 at 2 "
                 "match u8 0x10 0xff at 33")  # TCP, 20-byte IP header, under 128 bytes, flags = ACK


def shaping_commands(dev: str, mbit: float, queueing: str = "fair", peer: str = "dst", buckets: int = 8,
                     roles: int = 1) -> List[str]:
    """The tc commands (for `tc -batch`) that limit the egress of `dev` to `mbit` Mbit/s and share
    it as `queueing` says; `peer` is the address field that tells peers apart (dst or src),
    `buckets` (a power of two) how many classes share the link, per peer role when `roles` is 2
    (workers and PBoxes apart, by the low bit of the address's second octet)."""
    if queueing not in QUEUEING:
        raise ValueError(f"queueing {queueing!r}: choose one of {', '.join(QUEUEING)}")
    if buckets < 1 or buckets & (buckets - 1) or buckets > 128:
        raise ValueError(f"buckets {buckets}: must be a power of two up to 128")
    if roles not in (1, 2):
        raise ValueError(f"roles {roles}: 1, or 2 (workers and PBoxes apart)")
    kbit = max(buckets * _ACK_SHARE, round(mbit * 1000))
    htb_class = "class add dev {dev} parent {parent} classid {cls} htb rate {rate}kbit ceil {ceil}kbit quantum 1514"
    if queueing == "fifo":
        return [f"qdisc add dev {dev} root handle 1: htb default 1",
                htb_class.format(dev=dev, parent="1:", cls="1:1", rate=kbit, ceil=kbit)]
    # No default class: every IPv4 packet matches a bucket; what is not IPv4 (ARP) is sent directly.
    # (tc reads u32 values and masks as hex: they are written so.)
    commands = [f"qdisc add dev {dev} root handle 1: htb",
                htb_class.format(dev=dev, parent="1:", cls="1:1", rate=kbit, ceil=kbit),
                htb_class.format(dev=dev, parent="1:1", cls="1:2", rate=kbit // _ACK_SHARE, ceil=kbit) + " prio 0",
                f"filter add dev {dev} parent 1: protocol ip prio 1 u32 {_TCP_ACK_ONLY} flowid 1:2"]
    share = (kbit - kbit // _ACK_SHARE) // (buckets * roles)
    last_octet = {"dst": 19, "src": 15}[peer]
    for role in range(roles):
        by_role = f"match u8 0x{role:02x} 0x01 at {last_octet - 2} " if roles > 1 else ""
        for bucket in range(buckets):
            cls = bucket_class(role * buckets + bucket)
            commands += [htb_class.format(dev=dev, parent="1:1", cls=cls, rate=share, ceil=kbit) + " prio 1",
                         f"filter add dev {dev} parent 1: protocol ip prio 2 u32 "
                         f"match u8 0x{bucket:02x} 0x{buckets - 1:02x} at {last_octet} {by_role}flowid {cls}"]
    return commands


def link_roles(link: Link, plan: Plan) -> int:
    """2 on a PBox's links when there are several racks (their peers are workers and the other
    racks' PBoxes, whose addresses share last octets), else 1."""
    return 2 if link.kind == "pbox_nic" and len(plan.pboxes) > 1 else 1


def bucket_class(bucket: int) -> str:
    """The htb class id of fair-queueing bucket `bucket` (ids are hex; 1:1 and 1:2 are taken)."""
    return f"1:{0x100 + bucket:x}"


def shape(ns: str, dev: str, mbit: float, queueing: str, peer: str, buckets: int, roles: int = 1) -> None:
    """Limit the egress of `dev` in namespace `ns` (see `shaping_commands`)."""
    netns.tc_batch(ns, shaping_commands(dev, mbit, queueing, peer, buckets, roles))


def _add_link(link: Link, plan: Plan) -> None:
    low, high = link.lower, link.upper
    peer = ["netns", low.ns] if low.ns != high.ns else []
    ip(high.ns, "link", "add", "name", high.ifname, "type", "veth", "peer", "name", low.ifname, *peer)
    for end in (low, high):
        if end.bridge:
            ip(end.ns, "link", "set", "dev", end.ifname, "master", end.bridge)
        if end.address:
            ip(end.ns, "address", "add", f"{end.address}/{PREFIX_LEN}", "dev", end.ifname)
        if link.rate_mbit is not None:  # a node tells peers apart by destination, a switch port by source
            shape(end.ns, end.ifname, link.rate_mbit, plan.queueing, "dst" if end.address else "src",
                  plan.fair_buckets, link_roles(link, plan))
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
        _add_link(link, plan)
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
