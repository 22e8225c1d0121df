"""The model against what this machine measured, in both regimes, and at the paper's scale.

* `predict_emulated`: every single-rack emulated point (median of its repeats), this machine
  modelled (links at their measured rate, every node sharing 2 cores), the fitted costs.
* `predict_softcost`: every software-cost point (loopback, compute removed, full size), the
  same machine with no link limit.
* `paper_predictions`: the paper's 18 end-to-end speedups (PHub and PShard over stock MXNet at
  10 and 56 Gbps), its 4 breakdown models and its rack simulation's overheads (2..8 racks),
  derived with the paper's hardware at a range of CPU speed ratios; never measured.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, List, Sequence, Tuple

import pandas as pd

from .calibrate import cores_in_use, machine_cores, role_points
from .replay import Job, Machine, RoleCosts, simulate
from .traffic import exchange_counts
from .scenarios import (PAPER, THIS_MACHINE_CORES, job_from_row, job_from_softcost, loopback_machine, machine_from_row,
                        median_points, paper_job, paper_machine)

CPU_SPEED_RATIOS = (0.5, 1.0, 2.0)  # the paper's CPU over this machine's: assumed 1, spread 0.5x-2x
BREAKDOWN_NETWORK = "ib56g"  # the breakdown chart is "given enough bandwidth": the 56 Gbps setting
RACKS_NETWORK = "ib56g"  # the paper's rack simulation ran on its InfiniBand PBox
RACKS_QUANTITY = "rack-simulation overhead (%)"
PAPER_SYSTEMS = {"PHub": "phub", "PShard": "pshard"}
STOCK = "pslite-shard"  # the paper's stock MXNet (ps-lite over ZeroMQ, one server per worker)


# The same software under another placement: a system without rows of its own takes its twin's
# costs (pshard runs phub's server and client; pslite-central and -shard the same MXNet).
SAME_SOFTWARE = {"pshard": "phub", "phub": "pshard", "pslite-central": "pslite-shard",
                 "pslite-shard": "pslite-central"}


def _costs(fitted: Dict[str, RoleCosts], system: str) -> RoleCosts:
    return fitted.get(system) or fitted.get(SAME_SOFTWARE.get(system, ""), RoleCosts())


def _simulate_one(task: Tuple[Job, Machine, RoleCosts]) -> float:
    return simulate(*task)


def simulate_many(tasks: List[Tuple[Job, Machine, RoleCosts]], processes: int = 0) -> List[float]:
    """`simulate` of every (job, machine, costs), each distinct one once, over `processes`
    worker processes (0: one per core; 1: here). Blocks until all are done; a replay's
    exception is raised here."""
    # The biggest first (layers x workers, about what a replay costs), one at a time, so that
    # no process is left with the long ones at the end.
    distinct = sorted(dict.fromkeys(tasks), key=lambda task: -len(task[0].layers) * task[0].workers)
    processes = processes or os.cpu_count() or 1
    if processes > 1 and len(distinct) > 1:
        with ProcessPoolExecutor(max_workers=min(processes, len(distinct))) as pool:
            seconds = list(pool.map(_simulate_one, distinct))
    else:
        seconds = [_simulate_one(task) for task in distinct]
    found = dict(zip(distinct, seconds))
    return [found[task] for task in tasks]


def predict_emulated(runs: pd.DataFrame, fitted: Dict[str, RoleCosts]) -> pd.DataFrame:
    """One row per emulated point: measured and predicted seconds, signed relative error."""
    points = median_points(runs)
    predicted = simulate_many([(job_from_row(row), machine_from_row(row), _costs(fitted, row["system"]))
                               for _, row in points.iterrows()])
    points["predicted"] = predicted
    points["error"] = points["predicted"] / points["seconds"] - 1
    points["regime"] = "emulated"
    # What the machine's cores spent per iteration (the monitor's busy share of both cores) beside
    # what the fitted costs charge for the same exchange: the gap is CPU no role's cost holds.
    points["cpu_measured"] = points["cpu_busy"] * THIS_MACHINE_CORES * points["seconds"]
    jobs = [job_from_row(row) for _, row in points.iterrows()]
    points["cpu_charged"] = [charged_cpu(job, _costs(fitted, system)) for job, system in zip(jobs, points["system"])]
    points["messages"] = [exchange_counts(job)["worker_io"][1] for job in jobs]  # every worker's, each way
    return points


def charged_cpu(job: Job, costs: RoleCosts) -> float:
    """CPU seconds per iteration the fitted costs charge for one exchange of `job`, every role."""
    return sum(getattr(costs, role).seconds(messages, nbytes)
               for role, (nbytes, messages) in exchange_counts(job).items())


def predict_softcost(softcost: pd.DataFrame, fitted: Dict[str, RoleCosts], cores: float = None) -> pd.DataFrame:
    """One row per software-cost point (system, model, message setting): measured and predicted.
    A point whose rows record every role's run-queue wait runs each role's threads at its
    measured stretch (CPU plus wait over CPU) with no core simulated (`measured_wait` True);
    the others on `cores` shared cores (default: the cores the rows without a wait show the
    jobs kept busy, `calibrate.cores_in_use`, as a whole number)."""
    if softcost.empty:
        return pd.DataFrame(columns=["regime", "system", "model", "message_setting", "seconds", "predicted", "error"])
    keyed = softcost[softcost["role"] != "breakdown"]
    points = keyed.groupby(["system", "model", "message_setting"]).agg(
        seconds=("seconds_per_iteration", "median"), **{c: (c, "first") for c in keyed.columns
                                                         if c in ("workers", "cores", "interfaces", "chunk_bytes",
                                                                  "bigarray_bound")}).reset_index()
    roles = role_points(softcost)
    stretches = measured_stretch(roles)
    unwaited = keyed[[(r.system, r.model, r.message_setting) not in stretches for r in keyed.itertuples()]]
    shared = loopback_machine(cores_in_use(unwaited if not unwaited.empty else keyed) if cores is None else cores,
                              machine_cores(keyed, THIS_MACHINE_CORES))
    machines = [Machine(link_bytes_per_s=None, stretch=stretches[key]) if key in stretches else shared
                for key in zip(points["system"], points["model"], points["message_setting"])]
    points["predicted"] = simulate_many([(job_from_softcost(row), machine, _costs(fitted, row["system"]))
                                         for (_, row), machine in zip(points.iterrows(), machines)])
    points["error"] = points["predicted"] / points["seconds"] - 1
    points["regime"] = "software_cost"
    measured = roles.groupby(["system", "model", "message_setting"])["cpu"].sum()
    points["cpu_measured"] = [measured.get((r.system, r.model, r.message_setting)) for r in points.itertuples()]
    points["cpu_charged"] = [charged_cpu(job_from_softcost(row), _costs(fitted, row["system"]))
                             for _, row in points.iterrows()]
    points["measured_wait"] = [bool(m.stretch) for m in machines]
    points["cores"] = [m.shared_cores for m in machines]
    return points


def measured_stretch(roles: pd.DataFrame) -> Dict[tuple, Tuple[Tuple[str, float], ...]]:
    """(system, model, message_setting) -> per role (CPU + run-queue wait) / CPU, for the points
    whose every role with CPU recorded its wait (`calibrate.role_points` rows)."""
    out = {}
    for key, group in roles.groupby(["system", "model", "message_setting"]):
        busy = group[group["cpu"] > 0]
        if busy.empty or busy["wait"].isna().any():
            continue
        out[key] = tuple((r.role, float(1 + r.wait / r.cpu)) for r in busy.itertuples())
    return out


def error_summary(*frames: pd.DataFrame) -> pd.DataFrame:
    """Per regime and system (and all systems): points, median |error|, worst |error|."""
    rows = []
    for frame in frames:
        if frame.empty:
            continue
        for (regime, system), group in list(frame.groupby(["regime", "system"])) + \
                [((frame["regime"].iloc[0], "all"), frame)]:
            error = group["error"].abs()
            rows.append({"regime": regime, "system": system, "points": len(group),
                         "median_abs_error": float(error.median()), "worst_abs_error": float(error.max())})
    return pd.DataFrame(rows)


def loopback_terms(points: pd.DataFrame) -> pd.DataFrame:
    """Per system, the software-cost regime's error split into its two terms: the fitted costs
    against the CPU the roles spent (median |charged / measured CPU - 1|), and the cores the job
    kept busy (measured CPU over wall time, median) against the cores the replay gives it. The
    replay's time is about charged CPU / cores, so a system whose jobs kept fewer cores busy than
    that waited for something no role's CPU holds."""
    rows = points[points["regime"] == "software_cost"]
    out = []
    for system, group in rows.groupby("system"):
        out.append({"system": system, "points": len(group),
                    "cpu_fit_error": float((group["cpu_charged"] / group["cpu_measured"] - 1).abs().median()),
                    "cores_busy": float((group["cpu_measured"] / group["seconds"]).median()),
                    "cores_modelled": "measured wait" if group.get("measured_wait", pd.Series([False])).all()
                    else int(group["cores"].dropna().iloc[0]),
                    "median_abs_error": float(group["error"].abs().median())})
    return pd.DataFrame(out)


def _measured_speedups(runs: pd.DataFrame) -> Dict[tuple, float]:
    """(model, network, system) -> stock's median seconds over the system's, from the pbox rows."""
    pbox = runs[(runs["experiment"] == "pbox") & (runs["variant"].isin(["full", ""]))]
    median = pbox.groupby(["model", "setting", "system"])["seconds_per_iteration"].median()
    out = {}
    for (model, network, system), seconds in median.items():
        stock = median.get((model, network, STOCK))
        if stock is not None and system != STOCK:
            out[(model, network, system)] = stock / seconds
    return out


def paper_predictions(fitted: Dict[str, RoleCosts], reference: Dict[str, pd.DataFrame],
                      runs: pd.DataFrame = None, ratios: Sequence[float] = CPU_SPEED_RATIOS) -> pd.DataFrame:
    """The paper's speedups and breakdown ratios beside the model's (at each CPU ratio) and, for
    the speedups, beside this run's measured emulated one. `reference`: table name -> frame with
    speedup_end_to_end and breakdown_mxnet_ps (analysis.reference.load()'s tables' data)."""
    speedups = reference["speedup_end_to_end"]
    speedups = speedups[speedups["system"].isin(list(PAPER_SYSTEMS))]
    breakdown = reference["breakdown_mxnet_ps"]
    needed = {(m, n) for m, n in zip(speedups["model"], speedups["network"])}
    needed |= {(m, BREAKDOWN_NETWORK) for m in breakdown["model"].unique()}
    keys = [(model, network, system, ratio) for model, network in sorted(needed) for ratio in ratios
            for system in ("phub", "pshard", STOCK)]
    tasks = [(paper_job(system, model), paper_machine(network, ratio), _costs(fitted, system))
             for model, network, system, ratio in keys]
    seconds = dict(zip(keys, simulate_many(tasks)))
    measured = _measured_speedups(runs) if runs is not None and not runs.empty else {}
    rows = []
    for _, row in speedups.iterrows():
        ours = PAPER_SYSTEMS[row["system"]]
        setup = (row["model"], row["network"])
        values = {r: seconds[(*setup, STOCK, r)] / seconds[(*setup, ours, r)] for r in ratios}
        rows.append({"quantity": "speedup over stock MXNet", "model": row["model"], "network": row["network"],
                     "system": row["system"], "paper": float(row["speedup"]), **_spread(values),
                     "measured_emulated": measured.get((row["model"], row["network"], ours))})
    for model, parts in breakdown.groupby("model", sort=False):
        before = parts[parts["phase"] == "before"]
        after = parts[parts["phase"] == "after"]
        compute = float(before.loc[before["component"] == "compute", "seconds"].sum())
        stock_total, phub_total = float(before["seconds"].sum()), float(after["seconds"].sum())
        compute_model = sum(f + b for _, f, b in paper_job(STOCK, model).layers)
        stock = {r: seconds[(model, BREAKDOWN_NETWORK, STOCK, r)] for r in ratios}
        phub = {r: seconds[(model, BREAKDOWN_NETWORK, "phub", r)] for r in ratios}
        rows.append({"quantity": "stock non-compute / compute", "model": model, "network": BREAKDOWN_NETWORK,
                     "system": "stock MXNet", "paper": (stock_total - compute) / compute,
                     **_spread({r: (stock[r] - compute_model) / compute_model for r in ratios})})
        rows.append({"quantity": "PHub time / stock time", "model": model, "network": BREAKDOWN_NETWORK,
                     "system": "PHub", "paper": phub_total / stock_total,
                     **_spread({r: phub[r] / stock[r] for r in ratios})})
    racks = rack_simulation_predictions(fitted, reference.get("cross_rack_overhead"), runs, ratios)
    return pd.concat([pd.DataFrame(rows), racks], ignore_index=True)


def rack_simulation_predictions(fitted: Dict[str, RoleCosts], overheads: pd.DataFrame, runs: pd.DataFrame = None,
                                ratios: Sequence[float] = CPU_SPEED_RATIOS) -> pd.DataFrame:
    """The paper's rack-simulation chart beside the model's: per row of `overheads` (model, racks,
    overhead_pct: the reference table), phub's predicted overhead (%) of one PBox simulating that
    many racks over the plain PBox, 8 workers at 56 Gbps, each CPU speed ratio; beside this run's
    measured emulated overhead where it has one."""
    if overheads is None or overheads.empty or "phub" not in fitted:
        return pd.DataFrame()
    racks = sorted({int(r) for r in overheads["racks"]} | {1})
    keys = [(model, r, ratio) for model in sorted(overheads["model"].unique()) for r in racks for ratio in ratios]
    tasks = [(paper_job("phub", model, simulated_racks=r), paper_machine(RACKS_NETWORK, ratio), fitted["phub"])
             for model, r, ratio in keys]
    seconds = dict(zip(keys, simulate_many(tasks)))
    measured = _measured_rack_overheads(runs) if runs is not None and not runs.empty else {}
    rows = []
    middle = _middle(ratios)
    for row in overheads.itertuples():
        values = {q: 100 * (seconds[(row.model, int(row.racks), q)] / seconds[(row.model, 1, q)] - 1) for q in ratios}
        job = paper_job("phub", row.model)
        nbytes, messages = exchange_counts(job)["worker_io"]
        rows.append({"quantity": RACKS_QUANTITY, "model": row.model, "network": RACKS_NETWORK,
                     "system": f"PHub, {int(row.racks)} racks", "racks": int(row.racks),
                     "paper": float(row.overhead_pct), **_spread(values),
                     "measured_emulated": measured.get((row.model, int(row.racks))),
                     # what holds the one-rack iteration: each worker's one I/O thread's CPU, every
                     # byte and message it sends and receives (at the middle ratio), beside its time
                     "one_rack_seconds": seconds[(row.model, 1, middle)],
                     "worker_io_seconds": fitted["phub"].worker_io.seconds(messages / job.workers,
                                                                          nbytes / job.workers) / middle})
    return pd.DataFrame(rows)


def _measured_rack_overheads(runs: pd.DataFrame) -> Dict[tuple, float]:
    """(model, racks) -> this run's median overhead (%) of the one-PBox rack simulation."""
    from .. import derive  # the report's own derivation, so that both say the same number

    if "experiment" not in runs or not (runs["experiment"] == "cross_rack").any():
        return {}
    ours = derive.cross_rack(runs)
    ours = ours[ours["series"] == derive.SIMULATED]
    return ours.groupby(["model", "racks"])["overhead_pct"].median().to_dict() if not ours.empty else {}


def _middle(ratios: Sequence[float]) -> float:
    """The ratio a prediction is quoted at: 1 if given, else the middle one."""
    ratios = sorted(ratios)
    return 1.0 if 1.0 in ratios else ratios[len(ratios) // 2]


def _spread(values: Dict[float, float]) -> dict:
    """The value at the middle ratio (`_middle`) and the range over all ratios."""
    return {"predicted": values[_middle(values)], "low": min(values.values()), "high": max(values.values()),
            "ratios": ",".join(f"{r:g}" for r in sorted(values))}


def counts_check(softcost: pd.DataFrame) -> pd.DataFrame:
    """The rows' bytes and messages per exchange beside what the replay charges for the same
    job: the fitted costs mean what the replay does with them only where the two agree."""
    from .traffic import exchange_counts

    rows = []
    points = role_points(softcost)
    for _, point in points.iterrows():
        source = softcost[(softcost["system"] == point["system"]) & (softcost["model"] == point["model"])
                          & (softcost["message_setting"] == point["message_setting"])].iloc[0]
        model_bytes, model_messages = exchange_counts(job_from_softcost(source))[point["role"]]
        rows.append({"system": point["system"], "model": point["model"], "setting": point["message_setting"],
                     "role": point["role"], "bytes_ratio": point["nbytes"] / model_bytes if model_bytes else None,
                     "messages_ratio": point["messages"] / model_messages if model_messages else None})
    return pd.DataFrame(rows)


__all__ = ["predict_emulated", "predict_softcost", "measured_stretch", "loopback_terms", "charged_cpu",
           "simulate_many", "error_summary", "paper_predictions", "rack_simulation_predictions", "counts_check",
           "CPU_SPEED_RATIOS", "PAPER"]
