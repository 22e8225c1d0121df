"""The spec of an emulated rack: what to build, read from YAML, JSON or a dict, and checked.

Rates in a spec are written at the paper's scale (Gbit/s, e.g. 10 for the cloud setting, 56 for
InfiniBand) and divided by the network scale factor s_n to get what the emulated links run at:
this machine's CPUs shape a few Gbit/s in total, not 8 x 56. Model bytes are divided by s_m
(the chunk size stays 32 KB), and compute time is stretched by s_n / s_m so that communication
and compute keep the paper's ratio; s_t = s_m / s_n is the factor compute time is divided by.

    racks: 2                  # top-of-rack switches, one PBox each
    workers_per_rack: 2
    pbox_interfaces: 2        # NICs of each PBox (K)
    link_gbps: 10             # the paper's setting; host links and PBox NICs default to it
    host_link_gbps: 10        # optional
    pbox_nic_gbps: 10         # optional
    oversubscription: 2       # uplink = workers_per_rack * host link / ratio (default 1) ...
    uplink_gbps: 10           # ... or the uplink rate itself (not both)
    scale: {network: 50, model: 50}   # s_n (default: host links at 200 Mbit/s), s_m (default s_n)
    port: 19000               # base port of the rack servers (optional)
    queueing: fair            # fair (default: ACKs first, peers round-robin) or fifo (one queue)
    preflight: {enabled: true, seconds: 0.5, tolerance: 0.1, budget_mbit: 1000}

Every error names the key (and the file) at fault.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Union

from phub.errors import ConfigError

DEFAULT_HOST_MBIT = 200.0  # what the default s_n brings a host link down to
MAX_LINK_MBIT = 2000.0  # beyond this one emulated link needs more CPU than this machine has
MIN_LINK_MBIT = 1.0
MAX_GBPS = 10000.0  # a paper-scale rate (Gbit/s) beyond any NIC
MAX_SCALE = 1e6  # s_n, s_m (as the pipeline's config schema)
DEFAULT_PORT = 19000
QUEUEING = ("fair", "fifo")  # how a shaped link shares its queue; see rackbuild.shaping_commands

_TOP_KEYS = {"name", "racks", "workers_per_rack", "pbox_interfaces", "link_gbps", "host_link_gbps",
             "pbox_nic_gbps", "uplink_gbps", "oversubscription", "scale", "port", "preflight",
             "queueing"}
_SCALE_KEYS = {"network", "model"}
_PREFLIGHT_KEYS = {"enabled", "seconds", "tolerance", "budget_mbit"}


@dataclass(frozen=True)
class Preflight:
    enabled: bool = True
    seconds: float = 0.5  # length of each link's bulk transfer
    tolerance: float = 0.10  # largest accepted |measured / configured - 1|
    budget_mbit: float = 1000.0  # most configured traffic measured at the same time


@dataclass(frozen=True)
class RackSpec:
    racks: int
    workers_per_rack: int
    pbox_interfaces: int
    link_gbps: float
    host_link_gbps: float
    pbox_nic_gbps: float
    uplink_gbps: float
    oversubscription: float
    scale_network: float  # s_n
    scale_model: float  # s_m
    port: int = DEFAULT_PORT
    preflight: Preflight = Preflight()
    name: str = ""
    source: str = "<dict>"  # where the spec came from, for messages
    queueing: str = "fair"

    @property
    def scale_time(self) -> float:
        """s_t = s_m / s_n: compute time per iteration is divided by this (stretched when < 1)."""
        return self.scale_model / self.scale_network

    @property
    def num_workers(self) -> int:
        return self.racks * self.workers_per_rack

    def mbit(self, kind: str) -> float:
        """The emulated rate of a link kind (host, pbox_nic, uplink) in Mbit/s."""
        gbps = {"host": self.host_link_gbps, "pbox_nic": self.pbox_nic_gbps, "uplink": self.uplink_gbps}[kind]
        return gbps * 1000.0 / self.scale_network

    def to_dict(self) -> dict:
        out = asdict(self)
        out["scale_time"] = self.scale_time
        return out


def load_spec(spec: Union[str, os.PathLike, Mapping[str, Any], RackSpec],
              overrides: Optional[Mapping[str, Any]] = None) -> RackSpec:
    """A checked RackSpec from a file path (YAML or JSON), a mapping, or a RackSpec; `overrides`
    replaces top-level keys of a file or mapping (e.g. {"oversubscription": 4} for a sweep)."""
    if isinstance(spec, RackSpec):
        if overrides:
            raise ConfigError("rack spec: overrides apply to a spec file or mapping, not a parsed RackSpec")
        return spec
    if isinstance(spec, Mapping):
        return parse_spec({**spec, **(overrides or {})}, "<dict>")
    path = os.fspath(spec)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"rack spec {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"rack spec {path}: not UTF-8 text (byte {exc.start})") from None
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"rack spec {path}: not valid JSON: {exc}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"rack spec {path}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"rack spec {path}: expected a mapping of keys (racks, workers_per_rack, ...), "
                          f"got {type(data).__name__}")
    return parse_spec({**data, **(overrides or {})}, path)


def parse_spec(data: Mapping[str, Any], source: str = "<dict>") -> RackSpec:
    check = _Checker(source)
    check.known(data, _TOP_KEYS, "")
    racks = check.integer(data, "racks", 1, 250)
    per_rack = check.integer(data, "workers_per_rack", 1, 250)
    interfaces = check.integer(data, "pbox_interfaces", 1, 64)
    paper = check.number(data, "link_gbps", 10.0, high=MAX_GBPS)
    host = check.number(data, "host_link_gbps", paper, high=MAX_GBPS)
    nic = check.number(data, "pbox_nic_gbps", paper, high=MAX_GBPS)
    if data.get("uplink_gbps") is not None and data.get("oversubscription") is not None:
        raise check.error("uplink_gbps", "give either uplink_gbps or oversubscription, not both")
    ratio = check.number(data, "oversubscription", 1.0, high=1000.0)
    uplink = check.number(data, "uplink_gbps", per_rack * host / ratio, high=MAX_GBPS * 250)
    ratio = per_rack * host / uplink

    scale = data.get("scale") or {}
    if not isinstance(scale, Mapping):
        raise check.error("scale", f"must be a mapping with network and model, got {scale!r}")
    check.known(scale, _SCALE_KEYS, "scale.")
    s_n = check.number(scale, "network", host * 1000.0 / DEFAULT_HOST_MBIT, "scale.", high=MAX_SCALE)
    s_m = check.number(scale, "model", s_n, "scale.", high=MAX_SCALE)
    port = check.integer(data, "port", 1024, 65000, DEFAULT_PORT)

    pre = data.get("preflight")
    pre = {"enabled": pre} if isinstance(pre, bool) else (pre or {})
    if not isinstance(pre, Mapping):
        raise check.error("preflight", f"must be true, false or a mapping, got {pre!r}")
    check.known(pre, _PREFLIGHT_KEYS, "preflight.")
    enabled = pre.get("enabled", True)
    if not isinstance(enabled, bool):
        raise check.error("preflight.enabled", f"must be true or false, got {enabled!r}")
    preflight = Preflight(enabled, check.number(pre, "seconds", 0.5, "preflight.", 0.2, 5.0),
                          check.number(pre, "tolerance", 0.10, "preflight.", 0.01, 0.5),
                          check.number(pre, "budget_mbit", 1000.0, "preflight.", 10.0, 10000.0))
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 200:
        raise check.error("name", f"must be a string of at most 200 characters, got {name!r:.80}")
    queueing = data.get("queueing", "fair")
    if queueing not in QUEUEING:
        raise check.error("queueing", f"must be one of {', '.join(QUEUEING)}, got {queueing!r}")

    spec = RackSpec(racks, per_rack, interfaces, paper, host, nic, uplink, ratio, s_n, s_m, port, preflight,
                    name, source, queueing)
    for kind, key in (("host", "host_link_gbps"), ("pbox_nic", "pbox_nic_gbps"), ("uplink", "uplink_gbps")):
        if racks == 1 and kind == "uplink":
            continue  # a single rack has no core switch, hence no uplink
        rate = spec.mbit(kind)
        if not MIN_LINK_MBIT <= rate <= MAX_LINK_MBIT:
            raise check.error(
                "scale.network", f"{kind} links would run at {rate:.4g} Mbit/s ({key} {getattr(spec, key):g} "
                f"Gbit/s / s_n {s_n:g}); emulated links must be {MIN_LINK_MBIT:g}..{MAX_LINK_MBIT:g} Mbit/s "
                "for this machine's CPUs to shape them faithfully")
    return spec


class _Checker:
    def __init__(self, source: str):
        self.source = source

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"rack spec {self.source}: '{key}' {message}")

    def known(self, data: Mapping, allowed: set, prefix: str) -> None:
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise self.error(prefix + unknown[0], f"is not a known key (known: {', '.join(sorted(allowed))})")

    def integer(self, data: Mapping, key: str, low: int, high: int, default: Optional[int] = None) -> int:
        value = data.get(key, default)
        if value is None:
            raise self.error(key, "is required")
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(key, f"must be an integer in {low}..{high}, got {value!r}")
        return value

    def number(self, data: Mapping, key: str, default: float, prefix: str = "", low: float = 0.0,
               high: float = float("inf")) -> float:
        value = data.get(key)
        if value is None:
            return float(default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low < value <= high):  # NaN too
            bound = f"a number > {low:g}" + ("" if high == float("inf") else f" and <= {high:g}")
            raise self.error(prefix + key, f"must be {bound}, got {value!r}")
        return float(value)
