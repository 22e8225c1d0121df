"""The quantities the figures plot and the report compares, derived from tidy run rows.

Each function returns one row per measured repeat, so that figures can draw medians with
interquartile ranges. The report uses `median`. Rows whose measurement is empty are dropped, and
so are runs that failed verification (`failed_verification`): a wrong result is not a measurement.
The figures and the report both use these functions, so the two always show the same numbers.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Tuple

import pandas as pd

from .cost import deployment_cost, load_prices, tier
from .reference import PAPER_MODEL, Table
from .results import experiment as _experiment

BASELINE = "pslite-shard"  # the paper's "stock MXNet"
PSLITE = ("pslite-central", "pslite-shard")  # the stock PS in the breakdown, first one present
PLACEMENTS = ("CC", "CS", "NCC", "NCS")
COMPONENTS = ("compute", "aggregator", "optimizer", "network_and_other")  # named as in the paper


def failed_verification(runs: pd.DataFrame) -> pd.Series:
    """True for runs whose result was checked and found wrong: verified false where verification
    applies (verify_kind oracle or workers_agree). Runs with verify_kind "none" have nothing to
    check and are kept. Older files have no verify_kind, so a false `verified` there cannot tell a
    failure from a run that was never checked: those runs are kept, and `unchecked` counts them
    so that the report can say so."""
    kind = runs["verify_kind"].fillna("") if "verify_kind" in runs else pd.Series("", index=runs.index)
    return _not_verified(runs) & kind.isin(["oracle", "workers_agree"])


def unchecked(runs: pd.DataFrame) -> pd.Series:
    """True for runs with verified false and no verify_kind (older files; see failed_verification)."""
    kind = runs["verify_kind"].fillna("") if "verify_kind" in runs else pd.Series("", index=runs.index)
    return _not_verified(runs) & (kind == "")


def _not_verified(runs: pd.DataFrame) -> pd.Series:
    return (runs["verified"] == False).fillna(False).astype(bool)  # noqa: E712 (a nullable boolean column)


def experiment(runs: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of one experiment that may feed a number: failed verification left out."""
    rows = _experiment(runs, name)
    return rows[~failed_verification(rows)]


def median(frame: pd.DataFrame, by, value: str) -> pd.DataFrame:
    """Median of `value` per group, as a flat frame."""
    return frame.groupby(by, dropna=False)[value].median().reset_index()


def speedups(runs: pd.DataFrame, workers: Optional[int] = None) -> pd.DataFrame:
    """samples/s of each system over pslite-shard's median for the same model, setting and worker
    count. Only the largest worker count measured per (model, setting) is kept, because that is
    the closest to the paper's 8; with `workers`, only that count (every model measured there)."""
    pbox = experiment(runs, "pbox").dropna(subset=["samples_per_s"])
    keys = ["model", "setting", "workers"]
    base = pbox[pbox["system"] == BASELINE].groupby(keys)["samples_per_s"].median().rename("baseline")
    out = pbox[pbox["system"] != BASELINE].join(base, on=keys).dropna(subset=["baseline"])
    out["speedup"] = out["samples_per_s"] / out["baseline"]
    if workers is not None:
        out = out[out["workers"] == workers]
    else:
        out = out[out["workers"] == out.groupby(["model", "setting"])["workers"].transform("max")]
    return out[["model", "setting", "workers", "system", "repeat", "speedup"]].reset_index(drop=True)


def capacity(runs: pd.DataFrame) -> pd.DataFrame:
    """Exchanges per second per worker of one PHub server, by interfaces and active workers."""
    cap = experiment(runs, "capacity").dropna(subset=["exchanges_per_s", "interfaces"])
    cap = cap[cap["system"] == "phub"]
    cap["per_worker"] = cap["exchanges_per_s"] / cap["workers"]
    return cap[["model", "interfaces", "workers", "repeat", "per_worker"]].reset_index(drop=True)


def capacity_knee(cap: pd.DataFrame, keep: float = 0.9) -> Optional[Tuple[int, bool, str]]:
    """(workers, limit_reached, model) for the largest interface count: the most workers for which
    the median per-worker rate stays >= `keep` x the rate at the fewest workers. limit_reached is
    False when the rate never dropped, so that the count is only a lower bound. None without data."""
    if cap.empty:
        return None
    widest = cap[cap["interfaces"] == cap["interfaces"].max()]
    rates = widest.groupby("workers")["per_worker"].median().sort_index()
    sustained = rates >= keep * rates.iloc[0]
    if sustained.all():
        return int(rates.index[-1]), False, str(widest["model"].iloc[0])
    first_drop = int(sustained.to_numpy().argmin())
    return int(rates.index[max(first_drop - 1, 0)]), True, str(widest["model"].iloc[0])


def scaling(runs: pd.DataFrame) -> pd.DataFrame:
    """Exchanges per second (all workers together) with compute removed. A ring allreduce over one
    worker exchanges nothing, so gloo-ring at one worker is left out (as in the paper's chart)."""
    scale = experiment(runs, "scaling").dropna(subset=["exchanges_per_s"])
    scale = scale[~((scale["system"] == "gloo-ring") & (scale["workers"] == 1))]
    return scale[["model", "system", "workers", "repeat", "exchanges_per_s"]].reset_index(drop=True)


WIRE, SIMULATED = "wire", "simulated"  # the two cross-rack series (rack_series)


def rack_series(rows: pd.DataFrame) -> pd.DataFrame:
    """Cross-rack rows with `series`: "simulated" where one PBox stood in for R racks (the paper's
    method; `racks` becomes those R), "wire" where the racks were real (files without the
    `simulated_racks` column hold only those)."""
    simulated = rows["simulated_racks"].notna() if "simulated_racks" in rows else pd.Series(False, index=rows.index)
    out = rows.assign(series=simulated.map({True: SIMULATED, False: WIRE}))
    if simulated.any():
        out["racks"] = out["racks"].astype("float64")
        out.loc[simulated, "racks"] = out.loc[simulated, "simulated_racks"].astype("float64")
    return out


def cross_rack(runs: pd.DataFrame) -> pd.DataFrame:
    """PHub's overhead (%) of R racks over one rack, per series (`rack_series`): (time per
    iteration / the same series' one-rack median - 1) x 100."""
    rack = experiment(runs, "cross_rack").dropna(subset=["seconds_per_iteration", "racks"])
    rack = rack_series(rack[rack["system"] == "phub"])
    one = rack[rack["racks"] == 1].groupby(["series", "model"])["seconds_per_iteration"].median().rename("one_rack")
    out = rack[rack["racks"] > 1].join(one, on=["series", "model"]).dropna(subset=["one_rack"])
    out["overhead_pct"] = (out["seconds_per_iteration"] / out["one_rack"] - 1) * 100
    return out[["series", "model", "racks", "repeat", "overhead_pct"]].reset_index(drop=True)


def oversubscription(runs: pd.DataFrame, prices: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Throughput, deployment cost (see analysis.cost), throughput per $1000, and that last one
    relative to pshard's median at the same oversubscription ratio (the paper's 2:1 comparison)."""
    prices = load_prices() if prices is None else prices
    # a row without a link rate cannot be priced, nor one without its racks or ratio
    over = experiment(runs, "oversubscription").dropna(
        subset=["samples_per_s", "link_gbps", "racks", "oversubscription"])
    over = over[over["link_gbps"] > 0]
    columns = ["system", "oversubscription", "workers", "racks", "repeat", "samples_per_s",
               "tier_gbps", "cost_usd", "per_1000usd", "relative"]
    if over.empty:
        return pd.DataFrame(columns=columns)
    paper_gbps = over["link_gbps"] * over["s_n"].fillna(1.0)
    over["tier_gbps"] = [tier(prices, g) for g in paper_gbps]
    over["cost_usd"] = [deployment_cost(prices, r.system, int(r.workers), int(r.racks),
                                        int(r.interfaces) if pd.notna(r.interfaces) else 1,
                                        r.oversubscription, r.tier_gbps) for r in over.itertuples()]
    over["per_1000usd"] = over["samples_per_s"] / (over["cost_usd"] / 1000)
    shard = over[over["system"] == "pshard"].groupby("oversubscription")["per_1000usd"].median()
    over["relative"] = over["per_1000usd"] / over["oversubscription"].map(shard)
    return over[columns].reset_index(drop=True)


def breakdown(runs: pd.DataFrame) -> pd.DataFrame:
    """Where the time of one iteration goes, per model and system, from the breakdown variants.

    Compute is the replayed compute per iteration (the full runs' compute floor, see
    analysis.floors): a run with compute removed that the CPU bounds is no measure of what compute
    cost, so full minus no_compute is used only where no compute floor is known. The other
    components are the median time of the full run minus the median with that component
    suppressed. network_and_other is what remains. Components are clipped at 0, because noise can
    make a difference slightly negative. `relative` divides by the stock PS's full time for the
    model. That is pslite-central, or pslite-shard when central was not run. When neither was run,
    each system's own full time is used."""
    rows = experiment(runs, "breakdown").dropna(subset=["seconds_per_iteration"])
    med = rows.groupby(["model", "system", "variant"])["seconds_per_iteration"].median()
    full_rows = rows[rows["variant"] == "full"]
    replayed = (full_rows.groupby(["model", "system"])["compute_floor_seconds"].median()
                if "compute_floor_seconds" in full_rows else pd.Series(dtype=float))
    out = []
    for (model, system), times in med.groupby(level=["model", "system"]):
        times = times.droplevel(["model", "system"])
        if "full" not in times:
            continue
        full = times["full"]
        parts = {c: max(full - times[v], 0.0) for c, v in
                 (("compute", "no_compute"), ("aggregator", "no_aggregation"),
                  ("optimizer", "no_optimizer")) if v in times}
        compute = replayed.get((model, system), float("nan"))
        if compute > 0:
            parts["compute"] = min(float(compute), full)
        parts["network_and_other"] = max(full - sum(parts.values()), 0.0)
        out += [{"model": model, "system": system, "component": c, "seconds": s, "total": full}
                for c, s in parts.items()]
    frame = pd.DataFrame(out, columns=["model", "system", "component", "seconds", "total"])
    frame["stock_total"] = frame["model"].map(_stock_totals(frame)).fillna(frame["total"])
    frame["relative"] = frame["seconds"] / frame["stock_total"]
    return frame


def _stock_totals(frame: pd.DataFrame) -> Dict[str, float]:
    totals: Dict[str, float] = {}
    for system in reversed(PSLITE):  # the first of PSLITE wins
        rows = frame[frame["system"] == system]
        totals.update(rows.groupby("model")["total"].first().to_dict())
    return totals


def chunk_sweep(runs: pd.DataFrame) -> pd.DataFrame:
    """samples/s per chunk size, divided by the highest median over chunk sizes (per system)."""
    sweep = experiment(runs, "chunk_sweep").dropna(subset=["samples_per_s", "chunk_bytes"])
    peak = sweep.groupby(["system", "chunk_bytes"])["samples_per_s"].median().groupby("system").max()
    sweep["normalized"] = sweep["samples_per_s"] / sweep["system"].map(peak)
    return sweep[["system", "chunk_bytes", "repeat", "samples_per_s", "normalized"]].reset_index(drop=True)


def peak_chunk(sweep: pd.DataFrame, value: str = "normalized") -> Optional[int]:
    """The chunk size with the highest median `value` (None without data)."""
    if sweep.empty:
        return None
    return int(sweep.groupby("chunk_bytes")[value].median().idxmax())


def paper_compute_seconds(breakdown_table: Table) -> Dict[str, float]:
    """Compute seconds per iteration that the paper's breakdown chart gives (stock PS bars)."""
    data = breakdown_table.data
    rows = data[(data["phase"] == "before") & (data["component"] == "compute")]
    return {PAPER_MODEL.get(m, m): float(s) for m, s in zip(rows["model"], rows["seconds"])}


def bandwidth_per_ps(models: Iterable[str], compute_seconds: Mapping[str, float],
                     workers: int = 8, label: str = "given") -> pd.DataFrame:
    """Gbps one PS needs per placement, with the formulas of bandwidth_per_ps.csv's header.
    M is the model's bytes (phub's layouts), N is `workers` and T is `compute_seconds[model]`.
    t_source is `label` for the models in the mapping. A model missing from the mapping gets the
    compute profile of `experiments.models`, and its t_source is "estimated"."""
    from experiments.layouts import layout_bytes, load_layout

    out = []
    for model in models:
        if model in compute_seconds:
            seconds, source = float(compute_seconds[model]), label
        else:
            from experiments.models import compute_profile  # the project's one compute estimate
            seconds, source = compute_profile(model).seconds_per_iteration, "estimated"
        m_bits = layout_bytes(load_layout(model)) * 8 / 1e9  # gigabits
        n = workers
        demand = {"CC": 2 * m_bits * (n - 1) / seconds, "CS": 4 * m_bits * (n - 1) / (seconds * n),
                  "NCC": 2 * m_bits * n / seconds, "NCS": 2 * m_bits / seconds}
        out += [{"model": model, "placement": p, "gbps": demand[p], "compute_seconds": seconds,
                 "t_source": source} for p in PLACEMENTS]
    return pd.DataFrame(out, columns=["model", "placement", "gbps", "compute_seconds", "t_source"])


def bandwidth_table(ref: Mapping[str, Table], models: Iterable[str],
                    compute_seconds: Optional[Mapping[str, float]] = None) -> pd.DataFrame:
    """Our per-PS bandwidth for `models`: T from `compute_seconds` when given, else the paper's
    breakdown chart (chart-read), else estimated (see bandwidth_per_ps)."""
    if compute_seconds is not None:
        return bandwidth_per_ps(models, compute_seconds, label="given")
    return bandwidth_per_ps(models, paper_compute_seconds(ref["breakdown_mxnet_ps"]),
                            label="paper, chart-read")


def paper_chunk_bytes(rows: pd.DataFrame) -> pd.Series:
    """The chunk size each run corresponds to at the paper's model size: `chunk_bytes_paper`, or
    where an older file lacks it, chunk_bytes x s_m (the same definition)."""
    recorded = rows["chunk_bytes_paper"] if "chunk_bytes_paper" in rows else pd.Series(pd.NA, index=rows.index)
    scale = rows["s_m"].fillna(1.0) if "s_m" in rows else 1.0
    fallback = (rows["chunk_bytes"].astype("float64") * scale).round()
    return recorded.astype("float64").fillna(fallback)


def chunk_shape(runs: pd.DataFrame) -> pd.DataFrame:
    """The chunk sweep's shape: samples/s at each swept chunk size over the system's peak median,
    with the paper-equivalent chunk size (`paper_chunk_bytes`) beside our own."""
    sweep = experiment(runs, "chunk_sweep").dropna(subset=["samples_per_s", "chunk_bytes"])
    sweep["chunk_bytes_paper"] = paper_chunk_bytes(sweep)
    peak = sweep.groupby(["system", "chunk_bytes"])["samples_per_s"].median().groupby("system").max()
    sweep["normalized"] = sweep["samples_per_s"] / sweep["system"].map(peak)
    return sweep[["system", "chunk_bytes", "chunk_bytes_paper", "repeat", "normalized"]].reset_index(drop=True)


def multitenant(runs: pd.DataFrame) -> pd.DataFrame:
    """Cost of sharing one server beyond sharing its links, per job of the shared run:
    beyond_share = jobs x (median seconds per iteration of the job alone) / (its seconds shared).
    1.0 = no cost beyond the share; < 1 = the jobs slow each other down more than that."""
    rows = experiment(runs, "multitenant").dropna(subset=["seconds_per_iteration"])
    columns = ["model", "job", "jobs", "repeat", "beyond_share"]
    shared, alone = rows[rows["variant"] == "shared"].copy(), rows[rows["variant"] == "alone"]
    if shared.empty or alone.empty:
        return pd.DataFrame(columns=columns)
    per_job = alone.groupby("job")["seconds_per_iteration"].median()
    shared["jobs"] = shared.groupby("repeat")["job"].transform("nunique")
    shared["alone"] = shared["job"].map(per_job).fillna(alone["seconds_per_iteration"].median())
    shared["beyond_share"] = shared["jobs"] * shared["alone"] / shared["seconds_per_iteration"]
    return shared[columns].reset_index(drop=True)


def oversubscription_curve(runs: pd.DataFrame) -> pd.DataFrame:
    """Each system's samples/s at k:1 over its own median at 1:1 (same workers and racks)."""
    over = experiment(runs, "oversubscription").dropna(subset=["samples_per_s", "oversubscription"])
    keys = ["system", "workers", "racks"]
    one = over[over["oversubscription"] == 1].groupby(keys, dropna=False)["samples_per_s"].median().rename("at_1")
    out = over.join(one, on=keys).dropna(subset=["at_1"])
    out["relative_to_1"] = out["samples_per_s"] / out["at_1"]
    return out[keys + ["oversubscription", "repeat", "relative_to_1"]].reset_index(drop=True)


def calibration(runs: pd.DataFrame) -> pd.DataFrame:
    """One server core's sustained chunk rate with compute removed and links unshaped."""
    rows = experiment(runs, "calibration").dropna(subset=["chunks_per_s_per_core"])
    return rows[["chunk_bytes", "cores", "workers", "repeat", "chunks_per_s_per_core",
                 "gbit_per_s_per_core"]].reset_index(drop=True)


def capacity_flatness(cap: pd.DataFrame, workers: int = 8) -> Optional[float]:
    """Median per-worker rate at `workers` over the rate at one worker, at the largest interface
    count (1.0 = the server keeps up with every worker). None without both points."""
    if cap.empty:
        return None
    widest = cap[cap["interfaces"] == cap["interfaces"].max()]
    rates = widest.groupby("workers")["per_worker"].median()
    if 1 not in rates.index or workers not in rates.index:
        return None
    return float(rates[workers] / rates[1])
