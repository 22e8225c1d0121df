"""The normalized quantities that put our points and the paper's on the same axes, and what
bounded each of our points.

Absolute rates cannot match the paper's: links are scaled down by s_n, model bytes by s_m, and
the machine is not the paper's. Ratios can. Each function here returns one row per measured
repeat (ours) or per paper value, with the keys that the figure groups by. `summarize` turns the
repeats into a median and an interquartile range per plotted point, and carries the point's bound.

The bound of a run row (`bound` column, judged against the run's floor by analysis.floors) is
"compute" when the replayed compute set its pace, "wire" when a link ran nearly full, "cpu" when
this machine's cores or one process were saturated, "other" for the rest; empty when the run did
not record it. A plotted ratio is only as comparable as both of its points, so its bound is the
worse of the numerator's point's and the reference point's (`worst`).
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

import pandas as pd

from . import derive
from .reference import PAPER_MODEL, PAPER_TO_OURS
from .results import experiment
from .verdict import BOUND_ORDER

BOUNDS = ("compute", "wire", "cpu", "other")
WORST_FIRST = BOUND_ORDER[:-1]  # which bound of several wins, the report's order ("unknown" aside)
NOT_COMPARABLE = ("cpu",)  # bounds whose points say nothing about the paper's network
BASELINE = derive.BASELINE


# --- rows and bounds ---------------------------------------------------------------------------

def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as numbers (extra columns are read as text); NaN where absent or empty."""
    if column not in frame:
        return pd.Series(float("nan"), index=frame.index)
    return pd.to_numeric(frame[column], errors="coerce")


def usable(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows a figure may show: every row but those that failed the oracle's verification.
    Adds `bound` (one of BOUNDS, or "" when unknown) and `label` (experiment/point)."""
    out = runs.copy()
    for column in ("bound", "verify_kind", "point"):
        if column not in out:
            out[column] = ""
    out["bound"] = out["bound"].fillna("").astype(str).str.strip().str.lower()
    out.loc[~out["bound"].isin(BOUNDS), "bound"] = ""
    if "verified" in out:
        failed = out["verified"].astype(str).str.strip().str.lower().isin(("false", "0"))
        oracle = out["verify_kind"].fillna("").astype(str).str.strip().str.lower() == "oracle"
        out = out[~(failed & oracle)].copy()
    out["label"] = out["experiment"].astype(str) + "/" + _point_ids(out)
    return out


_CONFIG = (("system", ""), ("model", ""), ("setting", ""), ("workers", "n"), ("racks", "r"),
           ("interfaces", "k"), ("chunk_bytes", "c"), ("oversubscription", "o"), ("variant", ""))


def _point_ids(rows: pd.DataFrame) -> pd.Series:
    """The `point` id of each row; where it is empty, or shared by rows of different settings (as
    in old files), one made of the system and the settings that vary, e.g. "phub-alexnet-n8"."""
    point = rows["point"].fillna("").astype(str).str.strip()
    if rows.empty:
        return point
    texts = {}
    for column, prefix in _CONFIG:
        if column in rows:
            text = rows[column].astype(object).where(rows[column].notna(), "").astype(str)
            text = text.str.replace(r"\.0$", "", regex=True)
            texts[column] = text.map(lambda v, p=prefix: f"{p}{v}" if v not in ("", "nan", "<NA>") else "")
    config = pd.DataFrame(texts, index=rows.index)
    made = pd.Series("", index=rows.index, dtype=object)
    for _, group in config.groupby(rows["experiment"]):
        varying = [c for c in group if c == "system" or group[c].nunique() > 1]
        made[group.index] = group[varying].apply(lambda r: "-".join(v for v in r if v), axis=1)
    shared = made.groupby([rows["experiment"], point]).transform("nunique") > 1
    return point.where((point != "") & ~shared, made)


def worst(bounds: Iterable[str]) -> str:
    """One bound for several rows or points: the first of WORST_FIRST among them, "" when none is
    known."""
    bounds = set(bounds)
    return next((b for b in WORST_FIRST if b in bounds), "")



def point_bounds(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per measured point (`label`) with the bound of its repeats combined."""
    if rows.empty:
        return pd.DataFrame(columns=["label", "bound"])
    return rows.groupby("label", sort=True)["bound"].agg(worst).reset_index()


def bound_sentence(points: pd.DataFrame, limit: int = 8) -> str:
    """The caption's count, e.g. "Our 12 points: 11 wire-bound, 1 CPU-bound (scaling/phub-n8)."."""
    if points.empty:
        return "Our points: none in this run."
    parts = []
    for bound, text in (("compute", "compute-bound"), ("wire", "wire-bound"), ("cpu", "CPU-bound"),
                        ("other", "bound by neither (other)"), ("", "without a recorded bound")):
        labels = sorted(points.loc[points["bound"] == bound, "label"])
        if not labels:
            continue
        part = f"{len(labels)} {text}"
        if bound in NOT_COMPARABLE:
            shown = ", ".join(labels[:limit]) + (f", and {len(labels) - limit} more" if len(labels) > limit else "")
            part += f" ({shown})"
        parts.append(part)
    n = len(points)
    return f"Our {n} point{'s' if n != 1 else ''}: {', '.join(parts)}."


def summarize(values: pd.DataFrame, keys: Sequence[str], value: str) -> pd.DataFrame:
    """Median and interquartile range of `value` per group of `keys`, with the group's bound
    (the combined `bound` of its rows; "" when the frame has none)."""
    keys = list(keys)
    columns = keys + ["median", "q25", "q75", "bound"]
    values = values.dropna(subset=[value])
    if values.empty:
        return pd.DataFrame(columns=columns)
    if "bound" not in values:
        values = values.assign(bound="")
    groups = values.groupby(keys, sort=True, dropna=False)
    out = groups[value].median().rename("median").to_frame()
    out["q25"] = groups[value].quantile(0.25)
    out["q75"] = groups[value].quantile(0.75)
    out["bound"] = groups["bound"].agg(worst)
    return out.reset_index()[columns]


def _with_reference(frame: pd.DataFrame, reference: pd.DataFrame, keys: List[str],
                    value: str) -> pd.DataFrame:
    """`frame` joined with `reference`'s median `value` per `keys` (as `reference`) and its
    combined bound (as `reference_bound`); the row's `bound` becomes the worse of the two."""
    base = reference.groupby(keys)[value].median().rename("reference")
    base_bound = reference.groupby(keys)["bound"].agg(worst).rename("reference_bound")
    out = frame.join(base, on=keys).join(base_bound, on=keys).dropna(subset=["reference"])
    out["bound"] = [worst((a, b)) for a, b in zip(out["bound"], out["reference_bound"])]
    return out


# --- one function per figure -------------------------------------------------------------------

def speedup_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The pbox rows that figure (a) uses: the largest worker count per (model, setting)."""
    pbox = experiment(usable(runs), "pbox").dropna(subset=["samples_per_s"])
    if pbox.empty:
        return pbox
    return pbox[pbox["workers"] == pbox.groupby(["model", "setting"])["workers"].transform("max")]


def speedup(runs: pd.DataFrame) -> pd.DataFrame:
    """samples/s of each system over the median of stock MXNet (pslite-shard) at the same model,
    setting and worker count (figure (a), as derive.speedups, with bounds)."""
    pbox = speedup_rows(runs)
    keys = ["model", "setting", "workers"]
    out = _with_reference(pbox[pbox["system"] != BASELINE], pbox[pbox["system"] == BASELINE], keys,
                          "samples_per_s")
    out["speedup"] = out["samples_per_s"] / out["reference"]
    return out[keys + ["system", "repeat", "bound", "label", "speedup"]].reset_index(drop=True)


def paper_speedup(ref) -> pd.DataFrame:
    """The paper's speedups over stock MXNet, with our names where a system has one."""
    paper = ref["speedup_end_to_end"].data.rename(columns={"network": "setting"}).copy()
    return paper[["model", "setting", "system", "speedup"]]


def capacity_rows(runs: pd.DataFrame) -> pd.DataFrame:
    cap = experiment(usable(runs), "capacity").dropna(subset=["exchanges_per_s", "interfaces"])
    return cap[cap["system"] == "phub"]


def capacity(runs: pd.DataFrame) -> pd.DataFrame:
    """The server's total exchanges/s as a share of its highest median (per interface count), by
    active workers: 1.0 is the server's ceiling (figure (b))."""
    cap = capacity_rows(runs).copy()
    cap["total"] = cap["exchanges_per_s"]
    peak = cap.groupby(["interfaces", "workers"])["total"].median().groupby("interfaces").max()
    cap["share"] = cap["total"] / cap["interfaces"].map(peak)
    cap["per_worker"] = cap["exchanges_per_s"] / cap["workers"]
    return cap[["model", "interfaces", "workers", "repeat", "bound", "label", "per_worker", "share"]]


HARD_LIMIT = 1500.0  # million PCIe cache-line transfers/s of one PBox (printed)


def paper_capacity(ref) -> pd.DataFrame:
    """The paper's PCIe transfers as a share of the printed hard limit (1500 M/s)."""
    paper = ref["pbox_capacity"].data.copy()
    paper["share"] = paper["million_lines_per_s"] / HARD_LIMIT
    return paper


def scaling_rows(runs: pd.DataFrame) -> pd.DataFrame:
    scale = experiment(usable(runs), "scaling").dropna(subset=["exchanges_per_s"])
    return scale[~((scale["system"] == "gloo-ring") & (scale["workers"] == 1))]


def _scaling_ratios(frame: pd.DataFrame, keys: List[str], value: str) -> pd.DataFrame:
    """`efficiency`: (rate / n) over (rate / n) at the system's fewest workers, 1.0 = linear;
    `over_phub`: rate over PHub's median rate at the same worker count."""
    frame = frame.copy()
    group = keys + ["system"]
    med = frame.groupby(group + ["workers"])[value].median().reset_index()
    first = med.loc[med.groupby(group)["workers"].idxmin()].set_index(group)
    per_worker = (first[value] / first["workers"].astype(float)).rename("first_per_worker")
    frame = frame.join(per_worker, on=group)
    frame["efficiency"] = frame[value] / frame["workers"].astype(float) / frame["first_per_worker"]
    phub = med[med["system"] == "phub"].set_index(keys + ["workers"])[value].rename("phub")
    frame = frame.join(phub, on=keys + ["workers"])
    frame["over_phub"] = frame[value] / frame["phub"]
    return frame


def scaling(runs: pd.DataFrame) -> pd.DataFrame:
    """Per-worker scaling efficiency and each system over PHub, ours (figure (c)). A ratio over
    PHub carries PHub's bound too."""
    rows = scaling_rows(runs)
    columns = ["model", "system", "workers", "repeat", "bound", "label", "exchanges_per_s",
               "efficiency", "over_phub", "over_phub_bound"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = _scaling_ratios(rows, ["model"], "exchanges_per_s")
    phub_bound = rows[rows["system"] == "phub"].groupby(["model", "workers"])["bound"].agg(worst)
    theirs = [phub_bound.get((m, w), "") for m, w in zip(out["model"], out["workers"])]
    out["over_phub_bound"] = [worst((a, b)) for a, b in zip(out["bound"], theirs)]
    # the efficiency is relative to the system's fewest workers: its bound counts as well
    first = rows.loc[rows.groupby(["model", "system"])["workers"].transform("min") == rows["workers"]]
    first_bound = first.groupby(["model", "system"])["bound"].agg(worst)
    out["bound"] = [worst((b, first_bound.get((m, s), ""))) for b, m, s in
                    zip(out["bound"], out["model"], out["system"])]
    return out[columns].reset_index(drop=True)


def paper_scaling(ref) -> pd.DataFrame:
    """The paper's scaling chart, as the same two ratios (system names: ours where one exists)."""
    paper = ref["scaling_exchanges"].data.copy()
    paper["system"] = paper["system"].map(lambda s: PAPER_TO_OURS.get(s) or s)
    paper["model"] = ""
    return _scaling_ratios(paper, ["model"], "exchanges_per_s")


def cross_rack_rows(runs: pd.DataFrame) -> pd.DataFrame:
    rack = experiment(usable(runs), "cross_rack").dropna(subset=["seconds_per_iteration", "racks"])
    return derive.rack_series(rack[rack["system"] == "phub"])


def cross_rack(runs: pd.DataFrame) -> pd.DataFrame:
    """Overhead (%) of R racks over the same series' one-rack median (figure (d)), with bounds."""
    rack = cross_rack_rows(runs)
    out = _with_reference(rack[rack["racks"] > 1], rack[rack["racks"] == 1], ["series", "model"],
                          "seconds_per_iteration")
    out["overhead_pct"] = (out["seconds_per_iteration"] / out["reference"] - 1) * 100
    return out[["series", "model", "racks", "repeat", "bound", "label", "overhead_pct"]].reset_index(drop=True)


def oversubscription_rows(runs: pd.DataFrame) -> pd.DataFrame:
    return experiment(usable(runs), "oversubscription").dropna(subset=["samples_per_s", "oversubscription"])


def oversubscription(runs: pd.DataFrame) -> pd.DataFrame:
    """Throughput relative to the same system's median at 1:1 (figure (e), top)."""
    over = oversubscription_rows(runs)
    columns = ["system", "oversubscription", "repeat", "bound", "label", "relative_to_1"]
    one = over[over["oversubscription"] == 1]
    out = _with_reference(over, one, ["system"], "samples_per_s")
    out["relative_to_1"] = out["samples_per_s"] / out["reference"]
    return out[columns].reset_index(drop=True)


def per_dollar(runs: pd.DataFrame, prices=None) -> pd.DataFrame:
    """derive.oversubscription's throughput per $ relative to pshard, with the bound of each
    (system, ratio) point combined with pshard's at that ratio."""
    over = oversubscription_rows(runs)
    values = derive.oversubscription(over, prices)
    if values.empty:
        return values.assign(bound=pd.Series(dtype=object))
    own = over.groupby(["system", "oversubscription"])["bound"].agg(worst)
    values["bound"] = [worst((own.get((s, o), ""), own.get(("pshard", o), "")))
                       for s, o in zip(values["system"], values["oversubscription"])]
    return values


def paper_per_dollar(ref) -> pd.DataFrame:
    """cost.csv's throughput per $1000 relative to the standard sharded PS (= pshard)."""
    cost = ref["cost"].data
    paper = pd.DataFrame({"system": cost["design"].map({"PBox": "phub", "Standard-Shard": "pshard"}),
                          "oversubscription": cost["oversubscription"],
                          "per_1000usd": cost["throughput_per_1000usd"]})
    base = paper.loc[paper["system"] == "pshard"].set_index("oversubscription")["per_1000usd"]
    paper["relative"] = paper["per_1000usd"] / paper["oversubscription"].map(base)
    return paper


def breakdown_rows(runs: pd.DataFrame) -> pd.DataFrame:
    return experiment(usable(runs), "breakdown").dropna(subset=["seconds_per_iteration"])


def breakdown(runs: pd.DataFrame) -> pd.DataFrame:
    """PHub's full iteration time over the stock PS's median full time, per model and repeat
    (figure (f)). The stock PS is the first of derive.PSLITE that was run for the model."""
    rows = breakdown_rows(runs)
    full = rows[rows["variant"] == "full"]
    columns = ["model", "repeat", "bound", "label", "ratio", "stock"]
    stock = pd.DataFrame()
    for system in derive.PSLITE:
        found = full[(full["system"] == system) & ~full["model"].isin(stock.get("model", []))]
        stock = pd.concat([stock, found])
    if stock.empty:
        return pd.DataFrame(columns=columns)
    out = _with_reference(full[full["system"] == "phub"], stock, ["model"], "seconds_per_iteration")
    out["ratio"] = out["seconds_per_iteration"] / out["reference"]
    out["stock"] = out["model"].map(stock.groupby("model")["system"].first())
    return out[columns].reset_index(drop=True)


def paper_breakdown(ref) -> pd.DataFrame:
    """The paper's whole iteration after PHub over before, per model (our model names)."""
    data = ref["breakdown_mxnet_ps"].data
    totals = data.groupby(["model", "phase"])["seconds"].sum().unstack()
    out = (totals["after"] / totals["before"]).rename("ratio").reset_index()
    out["model"] = out["model"].map(lambda m: PAPER_MODEL.get(m, m))
    return out


def chunk_rows(runs: pd.DataFrame) -> pd.DataFrame:
    return experiment(usable(runs), "chunk_sweep").dropna(subset=["samples_per_s", "chunk_bytes"])


def paper_chunk_bytes(rows: pd.DataFrame) -> pd.Series:
    """The chunk size the paper would have used for the same number of chunks: the row's
    `chunk_bytes_paper`, or else chunk_bytes x s_m (model bytes are divided by s_m)."""
    given = _numeric(rows, "chunk_bytes_paper")
    scale = _numeric(rows, "s_m").fillna(1.0)
    return given.fillna(_numeric(rows, "chunk_bytes") * scale)


def chunk_sweep(runs: pd.DataFrame) -> pd.DataFrame:
    """samples/s relative to the system's peak median, by paper-equivalent chunk bytes (figure (g))."""
    sweep = chunk_rows(runs).copy()
    sweep["chunk_bytes_paper"] = paper_chunk_bytes(sweep)
    peak = sweep.groupby(["system", "chunk_bytes_paper"])["samples_per_s"].median().groupby("system").max()
    sweep["normalized"] = sweep["samples_per_s"] / sweep["system"].map(peak)
    return sweep[["system", "chunk_bytes", "chunk_bytes_paper", "repeat", "bound", "label",
                  "normalized"]].reset_index(drop=True)


def paper_chunk_sweep(ref) -> pd.DataFrame:
    paper = ref["chunk_size_sweep"].data.copy()
    paper["normalized"] = paper["samples_per_s"] / paper["samples_per_s"].max()
    paper["system"] = "phub"
    return paper


# which measured rows each figure shows, for the caption's count
FIGURE_ROWS = {"speedup_end_to_end": speedup_rows, "pbox_capacity": capacity_rows,
               "scaling": scaling_rows, "cross_rack": cross_rack_rows,
               "oversubscription": oversubscription_rows, "breakdown": breakdown_rows,
               "chunk_sweep": chunk_rows}
