"""Beyond one rack: the wire bound of the scheme phub runs between racks, and what the paper's
one-PBox simulation of racks costs here.

Two series share the cross-rack experiment (derive.rack_series). The *simulated* one is the
paper's method, compared with its chart (analysis.claims.rack). The *wire* one, racks with a PBox
each on the emulated network, is our extension: it is judged against the wire bound of the
reduce-scatter scheme, not against the paper's percentages (`wire_rows`, `report_lines`).

The scheme per iteration, for a model of M bytes, R racks of W workers and a PBox of k interfaces:
each worker's link carries M each way; each PBox's interfaces together carry its workers' W x M
plus 2(R-1)/R x M between racks (the partials of the chunks other racks own go out, the totals of
those come back, and the mirror for its own chunks) each way; each rack's uplink carries that
2(R-1)/R x M each way. Frames add their header to every chunk.
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Tuple

import pandas as pd

from experiments.monitor import CPU_BOUND
from phub.protocol.wire import HEADER_BYTES

from . import derive, normalize

GOAL = 1.1  # phub's time over the scheme's wire bound that the two-phase path aims at


def link_rates(row) -> Tuple[float, float, float]:
    """(host, PBox interface, rack uplink) rates of a cross-rack row in Gbit/s: link_gbps (the
    emulated host rate), pbox_link_gbps and uplink_gbps, the last two empty in older files (the
    host rate, and the rack's host links over the oversubscription ratio)."""
    host = _number(row, "link_gbps")
    pbox = _number(row, "pbox_link_gbps")
    ratio = _number(row, "oversubscription")
    uplink = _number(row, "uplink_gbps")
    per_rack = _number(row, "workers") / _number(row, "racks")
    return (host, pbox if pbox > 0 else host,
            uplink if uplink > 0 else per_rack * host / (ratio if ratio > 0 else 1.0))


def scheme_bound(row) -> float:
    """Seconds per iteration the reduce-scatter scheme needs on the row's links, at least its
    replayed compute; NaN when the row lacks a rate or its bytes. `row` has bytes_per_worker,
    workers, racks, interfaces, chunk_bytes and the rates `link_rates` reads."""
    host, pbox, uplink = link_rates(row)
    model_bytes, racks, workers = _number(row, "bytes_per_worker"), _number(row, "racks"), _number(row, "workers")
    if not host > 0 or not model_bytes > 0 or not racks >= 1 or not workers >= 1:
        return math.nan
    chunk = _number(row, "chunk_bytes")
    wire_bytes = model_bytes * (1 + HEADER_BYTES / chunk) if chunk > 0 else model_bytes
    per_rack = workers / racks
    interfaces = _number(row, "interfaces")
    interfaces = interfaces if interfaces >= 1 else 1.0  # NaN (not recorded) too
    between = 2 * (racks - 1) / racks * wire_bytes
    byte_gbit = [wire_bytes / host, (per_rack * wire_bytes + between) / interfaces / pbox]  # bytes / (Gbit/s)
    if racks > 1:
        byte_gbit.append(between / uplink)
    wire = max(byte_gbit) * 8 / 1e9
    compute = _number(row, "compute_floor_seconds")
    return max(wire, compute) if compute > 0 else wire


def replayed_bound(row) -> float:
    """Seconds per iteration of the same scheme replayed on the row's links with its compute and
    no CPU cost (analysis.model.multirack): unlike `scheme_bound`, it keeps the order in which
    backward releases the gradients and forward needs the weights, so the last gradients' trip
    between racks, which nothing overlaps, is in it. NaN when the row lacks a rate or its model."""
    from .model.replay import Machine, RoleCosts, simulate  # SimPy and the harness: only here
    from .model.scenarios import job_from_row

    host, pbox, uplink = link_rates(row)
    racks, workers = _number(row, "racks"), _number(row, "workers")
    if not host > 0 or not racks >= 1 or not workers >= racks or not isinstance(row.get("model"), str):
        return math.nan
    job = dataclasses.replace(job_from_row(row), racks=int(racks))
    machine = Machine(link_bytes_per_s=host * 1e9 / 8, server_link_bytes_per_s=pbox * 1e9 / 8,
                      uplink_bytes_per_s=uplink * 1e9 / 8)
    return simulate(job, machine, RoleCosts())


def _number(row: dict, column: str) -> float:
    try:
        return float(row.get(column))
    except (TypeError, ValueError):
        return math.nan


def wire_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (model, racks) of the wire series: the median time per iteration, the scheme's bound,
    the scheme replayed (`replayed_bound`, from the first repeat's row: the same for every repeat),
    the measured floor (the busiest link's bytes at its rate, or the compute), their ratios, the
    median share of this machine's cores the repeats kept busy (`cores_busy`), the worst bound of
    the repeats, whether most repeats were CPU-bound (`cpu_bound`: this machine's
    cores, not the links, held them) and the overhead over one rack."""
    rack = derive.experiment(runs, "cross_rack").dropna(subset=["seconds_per_iteration", "racks"])
    rack = derive.rack_series(rack[rack["system"] == "phub"])
    rack = rack[rack["series"] == derive.WIRE]
    columns = ["model", "racks", "workers", "seconds", "scheme_bound", "replayed", "floor", "over_scheme",
               "over_replayed", "floor_over_scheme", "overhead_pct", "cores_busy", "bound", "cpu_bound", "repeats"]
    if rack.empty:
        return pd.DataFrame(columns=columns)
    rack = rack.assign(scheme_bound=[scheme_bound(r) for r in rack.to_dict("records")])
    one = rack[rack["racks"] == 1].groupby("model")["seconds_per_iteration"].median()
    out = []
    for (model, racks), rows in rack.groupby(["model", "racks"]):
        seconds, bound = rows["seconds_per_iteration"].median(), rows["scheme_bound"].median()
        floor = pd.to_numeric(rows.get("floor_seconds"), errors="coerce").median() if "floor_seconds" in rows \
            else math.nan
        replayed = replayed_bound(rows.iloc[0].to_dict())
        out.append({"model": model, "racks": int(racks), "workers": int(rows["workers"].iloc[0]), "seconds": seconds,
                    "scheme_bound": bound, "replayed": replayed, "floor": floor, "over_scheme": seconds / bound,
                    "over_replayed": seconds / replayed,
                    "floor_over_scheme": floor / bound,
                    "overhead_pct": (seconds / one[model] - 1) * 100 if model in one and racks > 1 else math.nan,
                    "cores_busy": pd.to_numeric(rows.get("cpu_busy"), errors="coerce").median()
                    if "cpu_busy" in rows else math.nan,
                    "bound": normalize.worst(rows["bound"].fillna("")) if "bound" in rows else "",
                    "cpu_bound": _cpu_bound(rows),
                    "repeats": len(rows)})
    return pd.DataFrame(out, columns=columns)


def _cpu_bound(rows: pd.DataFrame) -> bool:
    """Whether this machine's CPU, not the links, held most repeats: labelled `cpu`, or with the
    cores at least CPU_BOUND busy. The replay the goal is judged on has no CPU, and a repeat
    whose busiest link was full is labelled `wire` however busy the cores were."""
    labelled = rows["bound"].isin(normalize.NOT_COMPARABLE) if "bound" in rows else pd.Series(False, index=rows.index)
    busy = pd.to_numeric(rows["cpu_busy"], errors="coerce") >= CPU_BOUND if "cpu_busy" in rows else False
    return bool((labelled | busy).mean() > 0.5)


def report_lines(runs: pd.DataFrame) -> List[str]:
    """Markdown for the report: the wire series against the scheme's bound and the scheme
    replayed, with the goal (judged on the replay)."""
    rows = wire_rows(runs)
    if rows.empty:
        return ["No cross-rack runs with racks on the wire in this run."]
    judged = rows[~rows["cpu_bound"]]
    met = judged["over_replayed"] <= GOAL
    cpu = rows[rows["cpu_bound"]]
    unjudged = (f" {len(cpu)} CPU-bound here ({', '.join(f'{r.model} at {r.racks} racks' for r in cpu.itertuples())}: "
                f"most repeats kept this machine's cores at least {CPU_BOUND:.0%} busy or one process saturated, "
                "so the links alone did not decide their time) are not judged." if len(cpu) else "")
    lines = ["Racks on the emulated network, a PBox each, reduce-scatter and all-gather between them: our "
             "extension, judged against that scheme on the same links, not against the paper's percentages, "
             "which came from its one-PBox simulation (the rows above). Two references: the scheme's *bound*, "
             "the busiest of a worker's link, a PBox's interfaces and a rack's uplink carrying what the scheme "
             "sends there (at least the replayed compute), which lets every byte cross while any compute runs; "
             "and the scheme *replayed* (the calibrated model's replay of these racks with no CPU cost: "
             "`analysis/model/multirack.py`), which keeps the order in which backward releases the gradients "
             "and forward needs the weights, so the first layers' gradients, released last, still cross to "
             "their owner rack and back after backward ends. An implementation can reach the replay, not the "
             f"bound. Goal: time ≤ {GOAL:g} × the scheme replayed; met at {int(met.sum())} of {len(judged)} "
             f"points.{unjudged} *measured floor / bound* near 1 says the links carried what the scheme says (the "
             "floor is the busiest link's measured bytes at its rate); *cores busy* is the median share of this "
             "machine's cores the repeats kept busy (one PBox and two workers a rack share them).", "",
             "| model | racks | workers | s per iteration | overhead vs one rack | scheme's bound (s) | time / bound "
             "| scheme replayed (s) | time / replayed | measured floor / bound | cores busy | bound | goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        overhead = "—" if math.isnan(r.overhead_pct) else f"{r.overhead_pct:+.0f}%"
        lines.append(f"| {r.model} | {r.racks} | {r.workers} | {r.seconds:.3f} | {overhead} | {r.scheme_bound:.3f} | "
                     f"{r.over_scheme:.2f} | {_fmt(r.replayed, 3)} | {_fmt(r.over_replayed)} | "
                     f"{_fmt(r.floor_over_scheme)} | {_percent(r.cores_busy)} | {r.bound or '—'} | "
                     f"{_goal(r)} |")
    return lines


def _goal(row) -> str:
    if row.cpu_bound:
        return "CPU-bound here"
    return "met" if row.over_replayed <= GOAL else "missed"


def _percent(share: float) -> str:
    return "—" if math.isnan(share) else f"{share:.0%}"


def _fmt(value: float, digits: int = 2) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


def simulation_ceiling(rows_r: pd.DataFrame, rows_one: pd.DataFrame) -> float:
    """The most overhead (%) the simulation's extra work can add here: the PBox's extra CPU
    seconds per iteration at R simulated racks (service_cpu, in cores, times the time per
    iteration; medians) over the one-rack time, as if none of it overlapped anything. NaN without
    the CPU figures."""
    def cpu_seconds(rows):
        cores = pd.to_numeric(rows.get("service_cpu"), errors="coerce") if "service_cpu" in rows else None
        if cores is None or cores.isna().all():
            return math.nan
        return float((cores * rows["seconds_per_iteration"]).median())

    one = float(rows_one["seconds_per_iteration"].median()) if len(rows_one) else math.nan
    extra = cpu_seconds(rows_r) - cpu_seconds(rows_one)
    return max(extra, 0.0) / one * 100 if one > 0 else math.nan
