"""From result rows (and the paper's setup) to the model's `Job` and `Machine`, with no I/O.

* An emulated run (`docs/results/points/<experiment>/*.csv`) becomes the model of this machine:
  its links at the rate the rack's preflight measured (`link_gbps_measured`, payload goodput;
  the configured `link_gbps` when that is missing), every node sharing this machine's 2 cores,
  the model divided by s_m and its compute by s_t, as `experiments.models.scaled` runs it.
* A software-cost row (loopback, compute removed, full-size model) becomes the same machine with
  no link limit: loopback's cost of moving bytes is CPU work, which the fitted per-byte costs
  already hold.
* The paper's setup: 8 workers, links at 10 or 56 Gbps, a PBox of 10 interfaces and 28 cores,
  worker nodes with their own cores (`PAPER`), the models at full size with the paper's compute.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
import pandas as pd

from experiments.models import compute_schedule, load_model, scaled

from .replay import DEFAULT_GROUPS, Job, Machine

THIS_MACHINE_CORES = 2  # every emulated node and every software-cost process share them
MXNET_BIGARRAY_BOUND = 1000 * 1000  # elements; what the committed runs used, unless a row says
# The paper's hardware (paper/NOTES.md: a PBox has 10 NICs and 28 server threads). The worker
# nodes' cores and a shard's cores are not printed: assumed here, and said so in the report.
PAPER = {"workers": 8, "pbox_interfaces": 10, "pbox_cores": 28, "worker_node_cores": 16,
         "shard_cores": 4, "chunk_bytes": 32768, "link_efficiency": 1.0,
         "gbps": {"cloud10g": 10.0, "ib56g": 56.0}}


@lru_cache(maxsize=None)
def _layers(model: str, s_m: float, s_t: float, compute: str):
    m = scaled(load_model(model), {"model": s_m, "time": s_t})
    forward, backward = compute_schedule(m, compute)
    sizes = [a.elements for a in m.arrays]
    return tuple((tuple(sizes[k] for k in layer.keys), f, b)
                 for layer, f, b in zip(m.layers, forward, backward))


def _number(row, column, default=None):
    value = row.get(column, default) if hasattr(row, "get") else default
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(value) else value


def job_from_row(row, groups: int = DEFAULT_GROUPS) -> Job:
    """The job of one emulated run row (a pandas Series or dict with the run columns)."""
    s_m, s_t = _number(row, "s_m", 1.0), _number(row, "s_t", 1.0)
    system = row["system"]
    return Job(system=system, layers=_layers(row["model"], s_m, s_t, row.get("compute") or "zero"),
               workers=int(row["workers"]), interfaces=int(_number(row, "interfaces", 1)),
               server_cores=int(_number(row, "cores", 1)),
               chunk_bytes=int(_number(row, "chunk_bytes", 32768)),
               bigarray_bound=int(_number(row, "bigarray_bound", MXNET_BIGARRAY_BOUND)), groups=groups,
               simulated_racks=int(_number(row, "simulated_racks", 1)))


def machine_from_row(row) -> Machine:
    """This machine as an emulated run saw it: links at the measured rate, 2 shared cores."""
    gbps = _number(row, "link_gbps_measured") or _number(row, "link_gbps")
    return Machine(link_bytes_per_s=gbps * 1e9 / 8 if gbps else None, shared_cores=THIS_MACHINE_CORES)


def _setting_knobs(row) -> dict:
    """chunk_bytes / bigarray_bound of a software-cost row: its columns, else its label
    ("chunk32k" -> 32768-byte chunks, "bound1m" -> a 1,000,000-element big-array bound)."""
    knobs = {}
    label = str(row.get("message_setting", ""))
    chunk = _number(row, "chunk_bytes")
    match = re.fullmatch(r"chunk(\d+)k", label)
    if chunk is None and match:
        chunk = int(match.group(1)) * 1024
    bound = _number(row, "bigarray_bound")
    match = re.fullmatch(r"bound(\d+)([km]?)", label)
    if bound is None and match:
        bound = int(match.group(1)) * {"": 1, "k": 1000, "m": 1000 * 1000}[match.group(2)]
    if chunk:
        knobs["chunk_bytes"] = int(chunk)
    if bound:
        knobs["bigarray_bound"] = int(bound)
    return knobs


def job_from_softcost(row, groups: int = DEFAULT_GROUPS) -> Job:
    """The job of one software-cost point (full size, compute removed, loopback)."""
    system = row["system"]
    cores = int(_number(row, "cores", 1) or 1)
    return Job(system=system, layers=_layers(row["model"], 1.0, 1.0, "zero"), workers=int(row["workers"]),
               interfaces=int(_number(row, "interfaces", 1) or 1), server_cores=cores, groups=groups,
               **_setting_knobs(row))


def loopback_machine(cores: float = THIS_MACHINE_CORES, machine_cores: int = THIS_MACHINE_CORES) -> Machine:
    """This machine on loopback: no link limit, `cores` (the cores the jobs kept busy,
    `calibrate.cores_in_use`, rounded to a whole core, at least 1, at most `machine_cores`, the
    machine's: what the rows record, else this machine's 2) shared by every process."""
    whole = machine_cores if cores != cores else min(machine_cores, max(1, round(cores)))
    return Machine(link_bytes_per_s=None, shared_cores=whole)


def paper_job(system: str, model: str, groups: int = DEFAULT_GROUPS, simulated_racks: int = 1) -> Job:
    """The paper's job: 8 workers, full-size model, its compute; phub on the PBox, pshard on the
    workers, stock MXNet = pslite-shard (its servers on the workers, MXNet's default bound);
    `simulated_racks`: phub's PBox standing in for that many racks, as the paper's chart ran it."""
    cores = {"phub": PAPER["pbox_cores"], "pshard": PAPER["shard_cores"]}.get(system, 1)
    return Job(system=system, layers=_layers(model, 1.0, 1.0, "replay"), workers=PAPER["workers"],
               interfaces=PAPER["pbox_interfaces"] if system == "phub" else 1, server_cores=cores,
               chunk_bytes=PAPER["chunk_bytes"], bigarray_bound=MXNET_BIGARRAY_BOUND, groups=groups,
               simulated_racks=simulated_racks)


def paper_machine(network: str, cpu_speed: float) -> Machine:
    """The paper's nodes: links at 10 or 56 Gbps, every node its own cores, CPUs `cpu_speed`
    times this machine's; a PBox's rack-simulation trips to itself cross its NICs."""
    rate = PAPER["gbps"][network] * 1e9 / 8 * PAPER["link_efficiency"]
    return Machine(link_bytes_per_s=rate, shared_cores=None, worker_node_cores=PAPER["worker_node_cores"],
                   server_node_cores=PAPER["pbox_cores"], cpu_speed=cpu_speed, trips_on_link=True)


def median_points(runs: pd.DataFrame, experiments=("pbox", "scaling", "breakdown", "chunk_sweep", "capacity",
                                                   "cross_rack")) -> pd.DataFrame:
    """One row per measured point of the single-rack experiments: the median seconds of its
    repeats, with the columns the model needs. Multi-rack points (cross_rack's racks on the wire,
    oversubscription) and multi-tenant ones are left out: the model has one rack and one job;
    cross_rack's one-PBox rack simulation is in (`simulated_racks`)."""
    rows = runs[runs["experiment"].isin(experiments) & (runs["network"] == "emulated")].copy()
    if "racks" in rows:
        rows = rows[rows["racks"].fillna(1).astype(int) == 1]
    keys = ["experiment", "point", "system", "model", "variant"]
    for column in ("bigarray_bound", "cpu_busy", "wire_floor_seconds", "simulated_racks", "measurement"):
        if column not in rows:
            rows[column] = float("nan")
    agg = rows.groupby(keys, dropna=False).agg(
        seconds=("seconds_per_iteration", "median"), workers=("workers", "first"),
        interfaces=("interfaces", "first"), cores=("cores", "first"), chunk_bytes=("chunk_bytes", "first"),
        link_gbps=("link_gbps", "first"), link_gbps_measured=("link_gbps_measured", "first"),
        s_m=("s_m", "first"), s_t=("s_t", "first"), compute=("compute", "first"),
        setting=("setting", "first"), bound=("bound", "first"), bigarray_bound=("bigarray_bound", "first"),
        cpu_busy=("cpu_busy", "median"), wire_floor=("wire_floor_seconds", "median"),
        simulated_racks=("simulated_racks", "first"), measurement=("measurement", "first"))
    # A measurement several experiments share (a pbox point is also breakdown's and the rack
    # simulation's one rack) is one point of the validation, not several.
    # The one kept is filed under the first of `experiments` that has it.
    rank = {name: i for i, name in enumerate(experiments)}
    agg = agg.reset_index().sort_values("experiment", key=lambda e: e.map(rank), kind="stable")
    shared = agg["measurement"].notna() & agg.duplicated("measurement")
    return agg[~shared].reset_index(drop=True)
