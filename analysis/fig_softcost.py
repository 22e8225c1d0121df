"""The software-cost figure: where a PS's CPU goes per exchange at full speed, over compute time,
beside the paper's breakdown chart (experiments.softcost's rows; `Results.software_cost`).

The paper's bars are seconds per iteration of its stock MXNet PS and of PHub, split by component
(breakdown_mxnet_ps.csv); each is divided here by the same model's compute bar. Ours are CPU
seconds per exchange of the whole 2-worker job on unshaped loopback (every process and thread
together), by the kind of code perf saw, divided by the model's compute seconds per iteration on
the paper's GPU (experiments.models; for these four models the paper's own compute bars). The
right panel splits the same CPU by role, for every system.

`tables` and `report_lines` are the pure part (the report calls `report_lines`).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

import pandas as pd
import seaborn as sns

from .plotting import OURS, PAPER, legend_below, no_data, panels, save
from .reference import PAPER_MODEL

MODELS = ("resnet269", "inception-v3", "googlenet", "alexnet")  # the paper's breakdown chart's
STOCK, PHUB = "pslite-shard", "phub"  # the paper's stock MXNet PS (ps-lite over ZeroMQ, sharded) and PHub
# the message setting each system ran in the paper: 32 KB chunks, MXNet's default big-array bound
PAPER_SETTING = {"phub": "chunk32k", "pshard": "chunk32k", "pslite-shard": "bound1m", "pslite-central": "bound1m",
                 "gloo-ring": "segment1m"}
ROLES = ("server", "worker_io", "worker_framework")
# one legend entry per component; the paper's chart lumps some of ours together
_PAPER_COMPONENT = {"data_copies": "copies", "aggregator": "aggregation", "optimizer": "optimizer",
                    "aggregator_and_optimizer": "aggregation + optimizer",
                    "sync_and_other": "synchronization + rest", "network_and_other": "network stack + rest"}
_COMPONENTS = ("copies", "aggregation", "optimizer", "aggregation + optimizer", "synchronization",
               "synchronization + rest", "network_stack", "network stack + rest", "rest")
_COLOURS = dict(zip(_COMPONENTS, sns.color_palette("tab10", 10)))
_ROLE_COLOURS = dict(zip(ROLES, sns.color_palette("Dark2", 3)))
_BAR = {"paper-stock": "paper\nstock", "paper-phub": "paper\nPHub", "ours-stock": "ours\nstock", "ours-phub": "ours\nphub"}


def _median(frame: pd.DataFrame, keys: List[str]) -> pd.DataFrame:
    """The median over repeats of cpu_seconds_per_exchange, with the compute time, per `keys`."""
    if frame.empty:
        return pd.DataFrame(columns=keys + ["cpu_seconds_per_exchange", "compute_seconds_per_iteration"])
    return (frame.groupby(keys, as_index=False)
            .agg(cpu_seconds_per_exchange=("cpu_seconds_per_exchange", "median"),
                 compute_seconds_per_iteration=("compute_seconds_per_iteration", "first")))


def _paper_setting(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["message_setting"] == rows["system"].map(PAPER_SETTING)]


def tables(software_cost: pd.DataFrame, ref) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """(breakdown, roles). breakdown: model, bar (paper-stock, paper-phub, ours-stock, ours-phub),
    component, over_compute (seconds of that component per iteration / compute seconds). roles:
    system, model, message_setting, role, cpu_seconds_per_exchange (median of the repeats),
    compute_seconds_per_iteration, over_compute; every setting of every system."""
    paper = ref["breakdown_mxnet_ps"].data.copy()
    paper["model"] = paper["model"].map(lambda m: PAPER_MODEL.get(m, m))
    compute = paper[paper["component"] == "compute"].groupby(["model", "phase"])["seconds"].first()
    paper = paper[paper["component"] != "compute"]
    bars = [pd.DataFrame({"model": paper["model"], "bar": "paper-" + paper["phase"].map({"before": "stock",
                                                                                        "after": "phub"}),
                          "component": paper["component"].map(_PAPER_COMPONENT),
                          "over_compute": [s / compute[(m, p)] for m, p, s in
                                           zip(paper["model"], paper["phase"], paper["seconds"])]})]
    frame = software_cost if not software_cost.empty else pd.DataFrame(
        columns=["system", "model", "role", "category", "message_setting", "cpu_seconds_per_exchange",
                 "compute_seconds_per_iteration"])
    parts = _paper_setting(frame[(frame["role"] == "breakdown") & frame["system"].isin([STOCK, PHUB])])
    ours = _median(parts, ["system", "model", "category"])
    if not ours.empty:
        bars.append(pd.DataFrame({"model": ours["model"], "bar": "ours-" + ours["system"].map({STOCK: "stock",
                                                                                              PHUB: "phub"}),
                                  "component": ours["category"],
                                  "over_compute": ours["cpu_seconds_per_exchange"]
                                  / ours["compute_seconds_per_iteration"].astype(float)}))
    breakdown = pd.concat(bars, ignore_index=True)
    roles = _median(frame[frame["role"].isin(ROLES)], ["system", "model", "message_setting", "role"])
    roles["over_compute"] = roles["cpu_seconds_per_exchange"] / pd.to_numeric(
        roles["compute_seconds_per_iteration"], errors="coerce")
    return breakdown, roles


def non_compute_over_compute(breakdown: pd.DataFrame) -> pd.DataFrame:
    """model x bar: the sum of the non-compute components over compute (the paper's stock PS:
    ResNet-269 3.49, Inception-v3 1.41, GoogleNet 1.60)."""
    return breakdown.groupby(["model", "bar"])["over_compute"].sum().unstack("bar")


def report_lines(software_cost: pd.DataFrame, ref) -> List[str]:
    """Markdown for the report: the breakdown over compute beside the paper's, and CPU per
    exchange by role for every system (the paper's message setting; every setting in the CSVs)."""
    if software_cost.empty:
        return ["The software-cost experiment has no rows in this run."]
    breakdown, roles = tables(software_cost, ref)
    sums = non_compute_over_compute(breakdown)
    lines = ["Non-compute time over compute time: the paper's stock MXNet PS and PHub (seconds per iteration, "
             "chart-read) beside ours (CPU seconds per exchange of the 2-worker job on unshaped loopback, "
             "full-size models, summed over every process, over the model's compute seconds on the paper's GPU).",
             "", "| model | paper stock | ours stock (pslite-shard) | paper PHub | ours phub |", "|---|---|---|---|---|"]
    for model in [m for m in MODELS if m in sums.index]:
        cells = [_fmt(sums.loc[model].get(bar)) for bar in ("paper-stock", "ours-stock", "paper-phub", "ours-phub")]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += ["", "CPU milliseconds per exchange by role (median of the repeats), in the paper's message setting:",
              "", "| system | model | setting | server | worker I/O | worker framework | all / compute |",
              "|---|---|---|---|---|---|---|"]
    mine = roles[roles["message_setting"] == roles["system"].map(PAPER_SETTING)]
    for (system, model, setting), rows in mine.groupby(["system", "model", "message_setting"]):
        by_role = rows.set_index("role")
        ms = [_fmt(by_role["cpu_seconds_per_exchange"].get(role, float("nan")) * 1e3, 0) for role in ROLES]
        lines.append(f"| {system} | {model} | {setting} | " + " | ".join(ms) + f" | {_fmt(rows['over_compute'].sum())} |")
    return lines


def _fmt(value, digits: int = 2) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def software_cost(frame: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Left: the breakdown over compute, the paper's stock PS and PHub beside ours, per model.
    Right: CPU per exchange by role over compute, every system, in the paper's message setting."""
    breakdown, roles = tables(frame, ref)
    fig, axes = panels(1, 2, sharey=False, size=(6.4, 4.2))
    left, right = axes[0]
    _stacked_bars(left, breakdown, "bar", list(_BAR), "component", _COLOURS, _BAR)
    left.set_title(f"where the time goes: {PAPER} (seconds), {OURS} (CPU seconds)", pad=16)
    left.set_ylabel("per iteration ÷ compute time")
    if not (breakdown["bar"].str.startswith("ours")).any():
        no_data(left)
    mine = roles[roles["message_setting"] == roles["system"].map(PAPER_SETTING)]
    systems = [s for s in PAPER_SETTING if s in set(mine["system"])]
    if mine.empty:
        no_data(right)
    else:
        _stacked_bars(right, mine.rename(columns={"system": "bar", "role": "component"}), "bar", systems,
                      "component", _ROLE_COLOURS, {s: s for s in systems})
    right.set_title(f"{OURS}: CPU by role, every system", pad=16)
    right.set_ylabel("CPU per exchange ÷ compute time")
    rows = legend_below(fig, axes, columns=5)
    return save(fig, out_dir, "software_cost", legend_rows=rows)


def _stacked_bars(ax, frame: pd.DataFrame, bar_column: str, bars: List[str], part_column: str, colours: dict,
                  labels: dict) -> None:
    """One group per model (MODELS order, then any other), one stacked bar per value of
    `bar_column` in `bars` order, parts coloured by `part_column`, its total written above it.
    A group far taller than the others (the paper's AlexNet) is cut at the axis' top."""
    models = [m for m in MODELS if m in set(frame["model"])] + sorted(set(frame["model"]) - set(MODELS))
    width = 0.8 / max(1, len(bars))
    ticks, names, totals = [], [], []
    for i, model in enumerate(models):
        for j, bar in enumerate(bars):
            x = i - 0.4 + width * (j + 0.5)
            rows = frame[(frame["model"] == model) & (frame[bar_column] == bar)]
            bottom = 0.0
            for part in colours:
                value = rows.loc[rows[part_column] == part, "over_compute"].sum()
                if value > 0:
                    ax.bar(x, value, width * 0.9, bottom=bottom, color=colours[part], label=part,
                           edgecolor="white", linewidth=0.5)
                    bottom += value
            ticks.append(x)
            names.append(labels.get(bar, bar))
            totals.append((x, bottom))
        ax.text(i, 1.01, model, ha="center", va="bottom", fontsize=8, transform=ax.get_xaxis_transform())
    ax.set_xticks(ticks)
    ax.set_xticklabels(names, rotation=90, fontsize=7)
    ax.set_xlim(-0.6, max(len(models), 1) - 0.4)
    heights = sorted(h for _, h in totals if h > 0)
    if heights:
        top = heights[-1] if len(heights) < 3 or heights[-1] <= 4 * heights[len(heights) // 2] else (
            1.3 * max(h for h in heights if h <= 4 * heights[len(heights) // 2]))
        ax.set_ylim(0, 1.12 * top)
        for x, h in totals:
            if h > 0:
                ax.text(x, min(h, 1.02 * top), f"{h:.2g}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.grid(axis="x", visible=False)
