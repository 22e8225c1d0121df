"""The experiment grid: config -> the list of points to measure, each a dict with an `id`.

Pure and deterministic, so Snakemake, the progress report and the tests all see the same list.
A point holds everything the runner needs: the `python -m experiments bench exchange` options and, on an emulated
network, the rack spec (rates at the paper's scale; the rack divides them by s_n).

How the paper's testbed is scaled down (config `rack:`), the same for every point:

* every host link runs at `max_link_mbit` (s_n = paper rate / that rate): on two cores, links
  this slow keep every point's cores mostly idle (measured: docs/reproducing.md);
* model bytes are divided by s_m = s_n / `time_stretch`, so a run takes `time_stretch` times the
  paper's time and compute (stretched by s_n / s_m) keeps the paper's ratio to communication;
* chunks are `chunk_bytes_paper` / s_m (the config sets the paper's 32 KB), so that a model
  travels in the number of chunks the paper's model would at that size, but never smaller than
  `min_chunk_bytes` (480 B: at 56 Gbps, 32 KB / s_m would be 84 B chunks, 28% of whose wire
  bytes would be their 32 B headers); or `chunk_bytes` as they are (default 8 KB). The point
  records the paper-equivalent chunk, chunk bytes x s_m, either way. The chunk sweep sets its
  own s_m and sizes.
* stock MXNet's big-array bound (MXNET_KVSTORE_BIGARRAY_BOUND, 10^6 elements at the paper's
  scale) is divided by s_m too (experiments.systems.pslite), so the arrays the paper's MXNet
  split over its servers are split here; a pslite point records the bound its run uses
  (`bigarray_bound`), which is part of its measurement.

Points that share a rack spec form a *shape*: the runner brings one rack up per shape and runs
all its points in it. Points with the same measurement (the same system, model, rack, options)
are measured once and recorded under each experiment that uses them (`share` below).
"""
from __future__ import annotations

import hashlib
import json
from typing import Dict, Iterator, List

from experiments.models import PAPER_CHUNK_BYTES, scaled_chunk
from experiments.rack.rackspec import parse_spec
from experiments.systems.pslite import BIGARRAY_BOUND, effective_bigarray_bound
from phub.protocol.wire import HEADER_BYTES

SETTINGS_GBPS = {"cloud10g": 10, "ib56g": 56}
DEFAULT_MAX_LINK_MBIT = 50.0  # config: rack.max_link_mbit
DEFAULT_TIME_STRETCH = 4.0  # config: rack.time_stretch
DEFAULT_CHUNK_BYTES = 8192  # config: rack.chunk_bytes (unless rack.chunk_bytes_paper is set)
# config: rack.min_chunk_bytes, the floor of chunks sized by rack.chunk_bytes_paper: a chunk's frame
# header stays at most 1/15 of what it moves (the paper's 32 KB chunks: 1/1000); 480 B
DEFAULT_MIN_CHUNK_BYTES = 15 * HEADER_BYTES
# What makes two points the same measurement (everything but where it is filed).
MEASUREMENT_KEYS = ("system", "model", "workers", "racks", "interfaces", "cores", "chunk_bytes", "compute",
                    "variant", "network", "rack", "repeats", "iterations", "warmup", "verify", "hostfile")


def _scale(config: dict, gbps: float, model_scale: float = 0.0, time_stretch: float = 0.0) -> dict:
    settings = config.get("rack", {})
    limit = settings.get("max_link_mbit", DEFAULT_MAX_LINK_MBIT)
    s_n = gbps * 1000 / limit
    s_m = model_scale or s_n / (time_stretch or settings.get("time_stretch", DEFAULT_TIME_STRETCH))
    return {"network": round(s_n, 6), "model": round(s_m, 6)}


def _rack(config: dict, racks: int, workers_per_rack: int, interfaces: int, gbps: float,
          oversubscription: float = 1.0, model_scale: float = 0.0, pbox_nic_gbps: float = 0.0,
          time_stretch: float = 0.0) -> dict:
    rack = {"racks": racks, "workers_per_rack": workers_per_rack, "pbox_interfaces": interfaces,
            "link_gbps": gbps, "oversubscription": float(oversubscription)}
    if pbox_nic_gbps:  # the PBox's headroom (the paper's had 10 NICs for 8 workers); else the hosts' rate
        rack["pbox_nic_gbps"] = pbox_nic_gbps
    passed = {k: v for k, v in config.get("rack", {}).items()
              if k not in ("max_link_mbit", "time_stretch", "chunk_bytes", "chunk_bytes_paper", "min_chunk_bytes")}  # preflight, port, queueing
    rack.update(passed, scale=_scale(config, gbps, model_scale, time_stretch))
    return rack


def _point(config: dict, exp: dict, experiment: str, id_: str, **fields) -> dict:
    emulated = config["network"] == "emulated"
    point = {"experiment": experiment, "id": id_, "verify": config.get("verify", True),
             "repeats": exp.get("repeats", config["repeats"]), "iterations": exp.get("iterations", config["iterations"]),
             "warmup": exp.get("warmup", config["warmup"]), "compute": "replay",
             "network": config["network"], "racks": 1, "interfaces": 1, "cores": config.get("server_cores", 1),
             "chunk_bytes": PAPER_CHUNK_BYTES, "oversubscription": 1, "setting": "", "variant": ""}
    if config["network"] == "hostfile":
        point["hostfile"] = config["hostfile"]
    point.update(fields)
    if not emulated:
        point.pop("rack", None)  # loopback and real machines: unshaped, unscaled
    s_m = point.get("rack", {}).get("scale", {}).get("model", 1)
    if emulated and "chunk_bytes" not in fields:
        settings = config.get("rack", {})
        paper = settings.get("chunk_bytes_paper")
        point["chunk_bytes"] = (max(scaled_chunk(paper, s_m), settings.get("min_chunk_bytes", DEFAULT_MIN_CHUNK_BYTES))
                                if paper else settings.get("chunk_bytes", DEFAULT_CHUNK_BYTES))
    point["chunk_bytes_paper"] = int(round(point["chunk_bytes"] * s_m))
    measured = {k: point.get(k) for k in MEASUREMENT_KEYS}
    measured["variant"] = "" if measured["variant"] == "full" else measured["variant"]  # full is the default
    if point.get("simulated_racks", 1) > 1:  # only its points: the others' measurements stay as they were
        measured["simulated_racks"] = point["simulated_racks"]
    if point.get("system", "").startswith("pslite"):  # only its points: the others' measurements stay as they were
        point["bigarray_bound"] = measured["bigarray_bound"] = effective_bigarray_bound(
            BIGARRAY_BOUND, point.get("rack", {}).get("scale"))
    point["measurement"] = _digest(measured)
    point["shape"] = _digest(point.get("rack") or {"network": point["network"], "point": id_})
    if emulated:  # the whole spec its rack will be built from, checked now: before anything starts
        parse_spec(point["rack"], f"of point {experiment}/{id_}")
    return point


def _digest(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def _pbox(config: dict, exp: dict) -> Iterator[dict]:
    for setting in exp["settings"]:
        for model in exp["models"]:
            for system in exp["systems"]:
                yield _point(config, exp, "pbox", f"{setting}-{model}-{system}", system=system, model=model,
                             workers=exp["workers"], setting=setting, interfaces=exp["interfaces"],
                             rack=_rack(config, 1, exp["workers"], exp["interfaces"], SETTINGS_GBPS[setting]))


def _capacity(config: dict, exp: dict) -> Iterator[dict]:
    for interfaces in exp["interfaces"]:
        for workers in exp["workers"]:
            yield _point(config, exp, "capacity", f"k{interfaces}-n{workers}", system="phub", model=exp["model"],
                         workers=workers, interfaces=interfaces, compute="zero",
                         rack=_rack(config, 1, workers, interfaces, exp["link_gbps"]))


def _scaling(config: dict, exp: dict) -> Iterator[dict]:
    for system in exp["systems"]:
        for workers in exp["workers"]:
            if system == "gloo-ring" and workers == 1:
                continue  # an allreduce over one rank exchanges nothing (the paper's chart starts gloo at 2)
            yield _point(config, exp, "scaling", f"{system}-n{workers}", system=system, model=exp["model"],
                         workers=workers, compute="zero", interfaces=exp["interfaces"],
                         rack=_rack(config, 1, workers, exp["interfaces"], exp["link_gbps"]))


def _cross_rack(config: dict, exp: dict) -> Iterator[dict]:
    """Two series. Racks on the wire (ours): a PBox per rack, reduce-scatter between them over the
    core. And the paper's own method (`simulated`): one PBox stands in for R racks by sending
    each aggregated chunk back to itself and aggregating it again R times (`--simulate-racks`);
    its one-rack point is the plain PBox run, and R > 1 cannot be checked against the oracle
    (the simulation sums R times), so those points run unverified. The wire series may set its
    own `time_stretch` (the same messages over a longer iteration), which the simulation keeps
    from `rack:`, as its one rack is the pbox point."""
    for model in exp["models"]:
        for racks in exp["racks"]:
            workers = racks * exp["workers_per_rack"]
            yield _point(config, exp, "cross_rack", f"{model}-r{racks}", system="phub", model=model, workers=workers,
                         racks=racks, interfaces=exp["interfaces"],
                         rack=_rack(config, racks, exp["workers_per_rack"], exp["interfaces"], exp["link_gbps"],
                                    pbox_nic_gbps=exp.get("pbox_nic_gbps", 0.0),
                                    time_stretch=exp.get("time_stretch", 0.0)))
    sim = exp.get("simulated")
    if not sim or not sim.get("enabled", True):
        return
    setting = sim.get("setting", "ib56g")
    for model in exp["models"]:
        for racks in sim["racks"]:
            fields = dict(simulated_racks=racks, verify=False) if racks > 1 else dict(simulated_racks=1)
            yield _point(config, exp, "cross_rack", f"sim-{model}-r{racks}", system="phub", model=model,
                         workers=sim["workers"], setting=setting, interfaces=sim["interfaces"], **fields,
                         rack=_rack(config, 1, sim["workers"], sim["interfaces"], SETTINGS_GBPS[setting]))


def _oversubscription(config: dict, exp: dict) -> Iterator[dict]:
    racks, per_rack = exp["racks"], exp["workers_per_rack"]
    for ratio in exp["ratios"]:
        for system in exp["systems"]:
            yield _point(config, exp, "oversubscription", f"{system}-o{ratio:g}", system=system, model=exp["model"],
                         workers=racks * per_rack, racks=racks, oversubscription=ratio, interfaces=exp["interfaces"],
                         rack=_rack(config, racks, per_rack, exp["interfaces"], exp["link_gbps"], ratio))


def _breakdown(config: dict, exp: dict) -> Iterator[dict]:
    setting = exp.get("setting", "ib56g")
    for model in exp["models"]:
        for system in exp["systems"]:
            for variant in exp["variants"]:
                # The full variant is the pbox point of the same model, system and setting when
                # the pbox experiment has it: the same measurement, taken once (see MEASUREMENT_KEYS).
                yield _point(config, exp, "breakdown", f"{model}-{system}-{variant}", system=system, model=model,
                             workers=exp["workers"], variant=variant,
                             setting=setting, interfaces=exp["interfaces"],
                             compute="zero" if variant == "no_compute" else "replay",
                             rack=_rack(config, 1, exp["workers"], exp["interfaces"], SETTINGS_GBPS[setting]))


def _chunk_sweep(config: dict, exp: dict) -> Iterator[dict]:
    """Paper-equivalent chunk sizes: a real chunk is the paper's size / s_m (the sweep's own
    `model_scale`), so each point moves as many chunks per model as the paper's would."""
    s_m = exp["model_scale"]
    for kb in exp["chunk_kb"]:
        yield _point(config, exp, "chunk_sweep", f"c{kb:g}k", system="phub", model=exp["model"],
                     workers=exp["workers"], chunk_bytes=scaled_chunk(kb * 1024, s_m), interfaces=exp["interfaces"],
                     rack=_rack(config, 1, exp["workers"], exp["interfaces"], exp["link_gbps"], model_scale=s_m))


def _multitenant(config: dict, exp: dict) -> Iterator[dict]:
    per_job = exp["workers_per_job"]
    yield _point(config, exp, "multitenant", f"{exp['model']}-j2", system="phub", model=exp["model"],
                 workers=2 * per_job, interfaces=exp["interfaces"], compute="zero", jobs=2,
                 rack=_rack(config, 1, 2 * per_job, exp["interfaces"], exp["link_gbps"]))


def _calibration(config: dict, exp: dict) -> Iterator[dict]:
    """One server core's chunk rate, compute removed, links unshaped (loopback, whatever the
    network): what limits a server here, for the capacity claim."""
    for kb in exp["chunk_kb"]:
        yield _point(dict(config, network="loopback"), exp, "calibration", f"c{kb:g}k", system="phub",
                     model=exp["model"], workers=exp["workers"], compute="zero", cores=1, chunk_bytes=int(kb * 1024))


GENERATORS = {"pbox": _pbox, "capacity": _capacity, "scaling": _scaling, "cross_rack": _cross_rack,
              "oversubscription": _oversubscription, "breakdown": _breakdown, "chunk_sweep": _chunk_sweep,
              "multitenant": _multitenant, "calibration": _calibration}


def points(config: dict) -> List[dict]:
    """Every point of every enabled experiment, in a stable order; ids are unique per experiment."""
    result: List[dict] = []
    for name, generate in GENERATORS.items():
        exp = config["experiments"].get(name)
        if exp and exp.get("enabled", True):
            result.extend(generate(config, exp))
    return result


def by_key(config: dict) -> Dict[str, dict]:
    """Points keyed by "experiment/id" (the wildcard path the workflow uses)."""
    return {f"{p['experiment']}/{p['id']}": p for p in points(config)}


def shapes(config: dict) -> Dict[str, List[dict]]:
    """Points grouped by rack spec, in grid order: one rack per group."""
    groups: Dict[str, List[dict]] = {}
    for p in points(config):
        groups.setdefault(p["shape"], []).append(p)
    return groups
