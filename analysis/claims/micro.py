"""Claims of the microbenchmarks: the chunk sweep (peak and shape), where time goes, and the
bandwidth one PS needs (computed, so derived)."""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional

import numpy as np
import pandas as pd

from experiments.monitor import NEAR_FLOOR

from .. import derive
from ..reference import PAPER_MODEL, Table
from ..verdict import CAUSE_UNKNOWN, DERIVED_BASIS, Claim
from ..fig_softcost import STOCK, non_compute_over_compute, tables
from ..model.calibrate import machine_cores
from .causes import Side, TimeRatio, ratio_causes, software_hidden
from .common import NAN, Runs, scaling_words, setup

SWEEP = "Microbenchmarks: chunk size"
BREAKDOWN = "Where time goes (breakdown)"
BANDWIDTH = "Bandwidth one PS needs (computed, N = 8)"
FORMULAS = {"CC": "2M(N−1)/T", "CS": "4M(N−1)/(TN)", "NCC": "2MN/T", "NCS": "2M/T"}
# A sweep whose every size gets at least this share of the best rate has no peak to place: the
# paper's falls to 0.35 and 0.23 at its ends, and repeats of one point here differ by a few percent.
FLAT = 0.95


def chunk_claims(runs: Runs, ref: Dict[str, Table]) -> List[Claim]:
    shape = derive.chunk_shape(runs.rows)
    shape = shape[shape["system"] == "phub"]
    rows = runs.kept("chunk_sweep", system="phub")
    evidence = runs.evidence("chunk_sweep", system="phub")
    paper = ref["chunk_size_sweep"].data.sort_values("chunk_bytes")
    paper_peak = int(paper.loc[paper["samples_per_s"].idxmax(), "chunk_bytes"])
    curve = pd.Series(paper["samples_per_s"].to_numpy() / paper["samples_per_s"].max(),
                      index=paper["chunk_bytes"].to_numpy())
    medians = shape.groupby("chunk_bytes_paper")["normalized"].median()
    peak = int(medians.idxmax()) if len(medians) else None
    why = ("Per-chunk costs here are those of TCP sockets, not RDMA verbs. Chunk sizes are compared at their "
           "paper-equivalent size (chunk bytes × s_m). " + setup(rows))
    flat = len(medians) > 1 and medians.min() >= FLAT * medians.max()
    if flat:  # the highest median is only where the noise put it
        ours_peak, cause = "none (flat)", (f"the sweep is flat: every size got at least "
                                          f"{medians.min() / medians.max():.3f} of the best rate, so it has no peak")
        note = f"Ours: the highest median samples/s was at {_kb(peak)}, within noise of every other size."
    else:
        ours_peak, cause = (peak / 1024 if peak else None), CAUSE_UNKNOWN
        note = "Ours: the paper-equivalent chunk size with the highest median samples/s." if peak else ""
    out = [Claim(SWEEP, "Training throughput peaks at 32 KB chunks", paper_peak / 1024, ours_peak, "exact",
                 unit=" KB", why=why if peak else "No chunk-sweep runs of phub.", note=note, cause=cause,
                 evidence=evidence)]
    if medians.empty:
        out.append(Claim(SWEEP, "Throughput at each swept chunk size relative to the peak", 1.0, None,
                         why="No chunk-sweep runs of phub."))
        return out
    ours_sizes = shape.groupby("chunk_bytes_paper")["chunk_bytes"].first()
    peak_rows = Side(f"phub at the peak ({_kb(peak)})", runs.kept("chunk_sweep", system="phub",
                                                                   chunk_bytes=int(ours_sizes[peak])))
    for size, value in medians.items():
        paper_value, how = paper_curve(curve, float(size))
        ratio = TimeRatio(peak_rows, Side(f"phub at {_kb(size)}", runs.kept("chunk_sweep", system="phub",
                                                                             chunk_bytes=int(ours_sizes[size]))))
        out.append(Claim(SWEEP, f"Throughput at {_kb(size)} (paper-equivalent) relative to the peak",
                         paper_value, float(value),
                         why=why if not math.isnan(paper_value) else
                         f"Outside the paper's sweep ({_kb(curve.index[0])}–{_kb(curve.index[-1])}).",
                         note=f"Ours swept {int(ours_sizes[size])} B chunks; the paper's value {how}.",
                         cause=ratio_causes(ratio, paper_value) if not math.isnan(paper_value) else "",
                         **ratio.limits(),
                         evidence=runs.evidence("chunk_sweep", system="phub", chunk_bytes=int(ours_sizes[size]))))
    return out


def paper_curve(curve: pd.Series, size: float):
    """The paper's normalized throughput at `size`: read at a swept size, or interpolated on a log2
    scale between the two swept sizes around it; NaN outside the sweep."""
    if size in curve.index:
        return float(curve[size]), "is read off the chart at this size"
    if size < curve.index[0] or size > curve.index[-1]:
        return NAN, ""
    value = float(np.interp(math.log2(size), np.log2(curve.index.to_numpy(dtype=float)), curve.to_numpy()))
    return value, "is interpolated on a log scale between the chart's neighbouring sizes"


def _kb(size: float) -> str:
    return f"{size / 1024:g} KB" if size < 1024 * 1024 else f"{size / 1024 / 1024:g} MB"


def breakdown_claims(runs: Runs, ref: Dict[str, Table], software_cost: Optional[pd.DataFrame] = None) -> List[Claim]:
    """Per model of the paper's breakdown chart: PHub's iteration time over the stock PS's (full
    runs), and the share of the stock PS's iteration not spent computing, with compute the
    replayed compute (the run's compute floor): a no-compute run of a CPU-bound stock PS is no
    measure of what compute cost it."""
    paper = ref["breakdown_mxnet_ps"].data.copy()
    paper["model"] = paper["model"].map(lambda m: PAPER_MODEL.get(m, m))
    why = ("The stock PS here is ps-lite over ZeroMQ (TCP), and replayed compute is stretched by s_t. "
           + setup(runs.kept("breakdown")))
    out = []
    for model, rows in paper.groupby("model", sort=False):
        before = rows[rows["phase"] == "before"]
        after_total = rows.loc[rows["phase"] == "after", "seconds"].sum()
        stock = next((s for s in derive.PSLITE if len(runs.kept("breakdown", model=model, system=s))), None)
        full = dict(model=model, variant="full")
        phub = Side("phub", runs.kept("breakdown", system="phub", **full))
        base = Side(f"stock MXNet ({stock})", runs.kept("breakdown", system=stock, **full)) if stock else None
        ratio = TimeRatio(phub, base, under_test="top") if base is not None and not phub.rows.empty else None
        paper_ratio = float(after_total / before["seconds"].sum())
        where = dict(full, system=["phub"] + ([stock] if stock else []))
        out.append(Claim(BREAKDOWN, f"{model}: PHub's iteration time / the stock PS's", paper_ratio,
                         ratio.value if ratio else NAN,
                         why=why if ratio else "Needs breakdown runs of phub and pslite for this model.",
                         note="Paper values chart-read.", cause=ratio_causes(ratio, paper_ratio),
                         evidence=runs.evidence("breakdown", **where),
                         **(ratio.limits(scaling_words(base.rows)) if ratio else {})))
        paper_share = float(1 - before.loc[before["component"] == "compute", "seconds"].sum() / before["seconds"].sum())
        share = NAN
        measured = stock_cpu_over_compute(software_cost, ref, model)
        if base is not None:
            compute = base.rows["compute_floor_seconds"].median()
            share = float(1 - compute / base.seconds) if compute > 0 else NAN
        out.append(Claim(BREAKDOWN, f"{model}: share of the stock PS's iteration not spent computing",
                         paper_share, share,
                         why=why if stock else "Needs breakdown runs of pslite for this model.",
                         note="Paper values chart-read. Compute is the replayed compute per iteration.",
                         cause=stock_share_cause(base, share, paper_share, measured) if base is not None else "",
                         evidence=runs.evidence("breakdown", **dict(full, system=stock))))
    return out


def stock_share_cause(base: Side, share: float, paper_share: float, measured: Optional[tuple] = None) -> str:
    """The cause of a differing stock share the rows show: the stock PS's software cost at full
    size (`measured`: stock_cpu_over_compute), divided away by the emulated rack
    (causes.software_hidden); the stock PS far above its floor (a larger share than the paper's)
    or at it (its time is then the floor's); CAUSE_UNKNOWN otherwise."""
    if math.isnan(share) or math.isnan(base.over):
        return CAUSE_UNKNOWN
    s_n = float(pd.to_numeric(base.rows["s_n"], errors="coerce").max()) if "s_n" in base.rows else math.nan
    if measured is not None and s_n > 1:
        found = software_hidden(measured[0], measured[1], s_n, share, paper_share)
        if found:
            return found
    if share > paper_share and base.over > NEAR_FLOOR:
        return f"{base.describe()}, which raises the share beyond the paper's"
    if share < paper_share and base.over <= NEAR_FLOOR:
        return (f"{base.describe()}: its time is its floor's, so none of the software cost behind the paper's "
                "share shows here")
    return CAUSE_UNKNOWN


def stock_cpu_over_compute(software_cost: Optional[pd.DataFrame], ref: Dict[str, Table],
                           model: str) -> Optional[tuple]:
    """(CPU seconds per exchange of the stock PS's whole job at full size over the model's compute
    seconds, the cores it ran on) from the software-cost experiment's rows; None without them."""
    if software_cost is None or software_cost.empty:
        return None
    sums = non_compute_over_compute(tables(software_cost, ref)[0])
    if model not in sums.index or "ours-stock" not in sums.columns or math.isnan(sums.loc[model, "ours-stock"]):
        return None
    rows = software_cost[(software_cost["system"] == STOCK) & (software_cost["model"] == model)]
    # the machine's cores where the rows record them; older rows ran 2 workers on this 2-core machine
    return float(sums.loc[model, "ours-stock"]), machine_cores(rows, default=2)


def bandwidth_claims(ref: Dict[str, Table],
                     compute_seconds: Optional[Mapping[str, float]] = None) -> List[Claim]:
    """Every placement of bandwidth_per_ps.csv, computed from model bytes and a compute time T:
    derived rows (the paper's own T from its breakdown chart, or the T given)."""
    paper = ref["bandwidth_per_ps"].data
    models = [PAPER_MODEL.get(m, m) for m in paper["model"]]
    ours = derive.bandwidth_table(ref, models, compute_seconds).set_index(["model", "placement"])
    out = []
    for paper_model, model in zip(paper["model"], models):
        row = paper[paper["model"] == paper_model].iloc[0]
        for placement in derive.PLACEMENTS:
            mine = ours.loc[(model, placement)]
            implied = mine["compute_seconds"] * mine["gbps"] / row[placement]
            out.append(Claim(BANDWIDTH, f"{model}, placement {placement}", float(row[placement]),
                             float(mine["gbps"]), unit=" Gbps", basis=DERIVED_BASIS,
                             method=(f"{FORMULAS[placement]} with M = the model's bytes (phub's layout), N = 8 and "
                                     f"T = {mine['compute_seconds']:.3g} s per iteration ({mine['t_source']}); "
                                     f"the paper's value implies T = {implied:.3f} s."),
                             note="Computed from model bytes, not measured."))
    return out
