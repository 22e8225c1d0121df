"""The quantities the figures plot and the report compares, derived from tidy run rows.

Each function returns one row per measured repeat, so that figures can draw medians with
interquartile ranges. The report uses `median`. Rows whose measurement is empty are dropped.
The figures and the report both use these functions, so the two always show the same numbers.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Tuple

import pandas as pd

from .cost import deployment_cost, load_prices, tier
from .reference import PAPER_MODEL, Table
from .results import experiment

BASELINE = "pslite-shard"  # the paper's "stock MXNet"
PSLITE = ("pslite-central", "pslite-shard")  # the stock PS in the breakdown, first one present
PLACEMENTS = ("CC", "CS", "NCC", "NCS")
COMPONENTS = ("compute", "aggregator", "optimizer", "network_and_other")  # named as in the paper


def median(frame: pd.DataFrame, by, value: str) -> pd.DataFrame:
    """Median of `value` per group, as a flat frame."""
    return frame.groupby(by, dropna=False)[value].median().reset_index()


def speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """samples/s of each system over pslite-shard's median for the same model, setting and worker
    count. Only the largest worker count measured per (model, setting) is kept, because that is
    the closest to the paper's 8."""
    pbox = experiment(runs, "pbox").dropna(subset=["samples_per_s"])
    keys = ["model", "setting", "workers"]
    base = pbox[pbox["system"] == BASELINE].groupby(keys)["samples_per_s"].median().rename("baseline")
    out = pbox[pbox["system"] != BASELINE].join(base, on=keys).dropna(subset=["baseline"])
    out["speedup"] = out["samples_per_s"] / out["baseline"]
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


def cross_rack(runs: pd.DataFrame) -> pd.DataFrame:
    """PHub's overhead (%) of R racks over one rack: (time per iteration / one rack's median - 1) x 100."""
    rack = experiment(runs, "cross_rack").dropna(subset=["seconds_per_iteration", "racks"])
    rack = rack[rack["system"] == "phub"]
    one = rack[rack["racks"] == 1].groupby("model")["seconds_per_iteration"].median().rename("one_rack")
    out = rack[rack["racks"] > 1].join(one, on="model").dropna(subset=["one_rack"])
    out["overhead_pct"] = (out["seconds_per_iteration"] / out["one_rack"] - 1) * 100
    return out[["model", "racks", "repeat", "overhead_pct"]].reset_index(drop=True)


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

    A component is the median time of the full run minus the median with that component
    suppressed. network_and_other is what remains. Components are clipped at 0, because noise can
    make a difference slightly negative. `relative` divides by the stock PS's full time for the
    model. That is pslite-central, or pslite-shard when central was not run. When neither was run,
    each system's own full time is used."""
    rows = experiment(runs, "breakdown").dropna(subset=["seconds_per_iteration"])
    med = rows.groupby(["model", "system", "variant"])["seconds_per_iteration"].median()
    out = []
    for (model, system), times in med.groupby(level=["model", "system"]):
        times = times.droplevel(["model", "system"])
        if "full" not in times:
            continue
        full = times["full"]
        parts = {c: max(full - times[v], 0.0) for c, v in
                 (("compute", "no_compute"), ("aggregator", "no_aggregation"),
                  ("optimizer", "no_optimizer")) if v in times}
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
    from phub.models import layout_bytes, load_layout

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
