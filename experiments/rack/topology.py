"""The plan of an emulated rack: every namespace, bridge, link, address and rate, with no I/O.

Names carry the run id, so several runs (and their leftovers) never collide:

    phub-<id>-sw        the switch namespace: one bridge per top-of-rack switch (tor0, tor1, ...)
                        and the core bridge (core, only with more than one rack)
    phub-<id>-w<g>      worker g (global rank), one interface eth0
    phub-<id>-pbox<r>   rack r's PBox, interfaces eth0..eth<K-1>
    phub-<id>-probe<r>  a measuring point on rack r's switch (probec: on the core), joined by an
                        unshaped link, used only by the preflight to measure one link at a time

Every address lies in 198.18.0.0/15 (the benchmarking range) and the whole rack is one flat /15
layer-2 network, so the kernel's connected route is the only route anywhere:
worker h of rack r is 198.18.r.(h+1), NIC k of rack r's PBox 198.19.r.(k+1), rack r's probe
198.19.r.254, the core's probe 198.19.255.254.

A link is a veth pair. Its *lower* end sits at the node (or, for an uplink, at the top-of-rack
bridge), its *upper* end at the switch; "up" traffic leaves the lower end, "down" traffic the
upper end, and each end's egress is shaped to the link's rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from .rackspec import RackSpec

PREFIX_LEN = 15
NETWORK = "198.18.0.0/15"
NAME_PREFIX = "phub-"


@dataclass(frozen=True)
class End:
    ns: str
    ifname: str
    bridge: Optional[str] = None  # the bridge this end is a port of (switch side)
    address: Optional[str] = None  # IPv4 address (node side)


@dataclass(frozen=True)
class Link:
    name: str  # w3, pbox0.nic1, uplink0, probe0
    kind: str  # host, pbox_nic, uplink, probe
    rate_mbit: Optional[float]  # None: not shaped
    lower: End
    upper: End
    rack: Optional[int] = None


@dataclass(frozen=True)
class Host:
    """A node of the rack: a worker, a PBox or a probe."""

    ns: str
    addresses: Tuple[str, ...]
    rack: int


@dataclass(frozen=True)
class Plan:
    run_id: str
    switch_ns: str
    bridges: Tuple[str, ...]
    workers: Tuple[Host, ...]  # in rank order, racks consecutive
    pboxes: Tuple[Host, ...]  # one per rack
    probes: Tuple[Host, ...]  # one per rack, then the core's (if any)
    links: Tuple[Link, ...]
    queueing: str = "fair"  # how each shaped link shares its queue (rackspec.QUEUEING)
    fair_buckets: int = 2  # with fair queueing: classes per link, one per peer of a rack


    @property
    def namespaces(self) -> List[str]:
        return [self.switch_ns] + [h.ns for h in self.workers + self.pboxes + self.probes]

    def shaped_links(self) -> List[Link]:
        return [link for link in self.links if link.rate_mbit is not None]

    def probe_of(self, rack: Optional[int]) -> Host:
        """The probe on rack `rack`'s switch, or the core's for None."""
        return self.probes[-1] if rack is None else self.probes[rack]

    def endpoints(self, link: Link) -> Tuple[Tuple[str, str], Tuple[str, str]]:
        """(namespace, address) below and above `link`, joined by no other shaped link."""
        if link.kind == "uplink":
            below = self.probe_of(link.rack)
            above = self.probe_of(None)
            return (below.ns, below.addresses[0]), (above.ns, above.addresses[0])
        probe = self.probe_of(link.rack)
        return (link.lower.ns, link.lower.address), (probe.ns, probe.addresses[0])


def ns_prefix(run_id: str) -> str:
    return f"{NAME_PREFIX}{run_id}-"


def make_plan(spec: RackSpec, run_id: str) -> Plan:
    pre = ns_prefix(run_id)
    sw = pre + "sw"
    multi = spec.racks > 1
    bridges = tuple(f"tor{r}" for r in range(spec.racks)) + (("core",) if multi else ())
    workers, pboxes, probes, links = [], [], [], []
    for r in range(spec.racks):
        tor = f"tor{r}"
        for h in range(spec.workers_per_rack):
            g = r * spec.workers_per_rack + h
            host = Host(f"{pre}w{g}", (f"198.18.{r}.{h + 1}",), r)
            workers.append(host)
            links.append(Link(f"w{g}", "host", spec.mbit("host"), End(host.ns, "eth0", address=host.addresses[0]),
                              End(sw, f"w{g}", bridge=tor), r))
        pbox = Host(f"{pre}pbox{r}", tuple(f"198.19.{r}.{k + 1}" for k in range(spec.pbox_interfaces)), r)
        pboxes.append(pbox)
        for k, address in enumerate(pbox.addresses):
            links.append(Link(f"pbox{r}.nic{k}", "pbox_nic", spec.mbit("pbox_nic"),
                              End(pbox.ns, f"eth{k}", address=address), End(sw, f"p{r}n{k}", bridge=tor), r))
        probe = Host(f"{pre}probe{r}", (f"198.19.{r}.254",), r)
        probes.append(probe)
        links.append(Link(f"probe{r}", "probe", None, End(probe.ns, "eth0", address=probe.addresses[0]),
                          End(sw, f"pr{r}", bridge=tor), r))
        if multi:
            links.append(Link(f"uplink{r}", "uplink", spec.mbit("uplink"), End(sw, f"up{r}", bridge=tor),
                              End(sw, f"dn{r}", bridge="core"), r))
    if multi:
        probe = Host(f"{pre}probec", ("198.19.255.254",), -1)
        probes.append(probe)
        links.append(Link("probec", "probe", None, End(probe.ns, "eth0", address=probe.addresses[0]),
                          End(sw, "prc", bridge="core")))
    peers = max(2, spec.workers_per_rack, spec.pbox_interfaces)  # what one link's busy peers may number
    buckets = min(64, 1 << (peers - 1).bit_length())
    return Plan(run_id, sw, bridges, tuple(workers), tuple(pboxes), tuple(probes), tuple(links), spec.queueing,
                buckets)
