"""Figures beyond one rack: the overhead of several racks, and core oversubscription with cost."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd
import seaborn as sns

from . import derive
from .plotting import ERRORBAR, ESTIMATOR, OURS, PAPER, label_order, legend_below, no_data, panels, save, system_palette
from .reference import system_label

RATIOS = (1, 2, 4, 8)
COST_DESIGNS = {"PBox": "phub", "Standard-Shard": "pshard"}  # cost.csv's designs -> our systems


def cross_rack(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (d): overhead (%) of R racks over one rack, PHub's two-phase reduction."""
    paper = ref["cross_rack_overhead"].data
    ours = derive.cross_rack(runs)
    models = sorted(set(paper["model"]) | set(ours["model"]))
    palette = dict(zip(models, sns.color_palette("colorblind", len(models))))
    fig, axes = panels(1, 2, sharey=True)
    for ax, source, data in ((axes[0][0], PAPER, paper), (axes[0][1], OURS, ours)):
        ax.set_title(source)
        if data.empty:
            no_data(ax)
            continue
        sns.lineplot(data, x="racks", y="overhead_pct", hue="model", palette=palette, marker="o",
                     ax=ax, estimator=ESTIMATOR, errorbar=ERRORBAR if source == OURS else None,
                     err_style="bars")
        ax.set(xlabel="racks", xticks=range(2, 9))
    axes[0][0].set_ylabel("overhead vs one rack (%)")
    rows = legend_below(fig, axes, title="model")
    return save(fig, out_dir, "cross_rack", legend_rows=rows)


def oversubscription(runs: pd.DataFrame, ref, out_dir: Path,
                     prices: Optional[pd.DataFrame] = None) -> Path:
    """Figure (e): throughput vs core oversubscription (top), and throughput per $1000 relative to
    the sharded PS at the same ratio (bottom). The paper's only recovered point is 2:1 (cost.csv)."""
    cost = ref["cost"].data
    paper = pd.DataFrame({"system": cost["design"].map(COST_DESIGNS),
                          "oversubscription": cost["oversubscription"],
                          "per_1000usd": cost["throughput_per_1000usd"]})
    base = paper.loc[paper["system"] == "pshard"].set_index("oversubscription")["per_1000usd"]
    paper["relative"] = paper["per_1000usd"] / paper["oversubscription"].map(base)
    ours = derive.oversubscription(runs, prices)
    for frame in (paper, ours):
        frame["label"] = frame["system"].map(system_label)
    palette = system_palette(set(paper["system"]) | set(ours["system"]))
    fig, axes = panels(2, 2, sharey="row", size=(5.2, 3.2))
    no_data(axes[0][0], "the paper's throughput curve was not recovered\n(only its 2:1 cost point, below)")
    axes[0][0].set_title(f"{PAPER} — throughput")
    axes[0][1].set_title(f"{OURS} — throughput")
    axes[1][0].set_title(f"{PAPER} — throughput per \\$1000 (cost.csv)")
    axes[1][1].set_title(f"{OURS} — throughput per \\$1000")
    sns.scatterplot(paper, x="oversubscription", y="relative", hue="label", palette=palette, s=90,
                    hue_order=label_order(paper["system"]), ax=axes[1][0], zorder=3)
    for row in paper.itertuples():
        axes[1][0].annotate(f"{row.per_1000usd:g} / \\$1000", (row.oversubscription, row.relative),
                            textcoords="offset points", xytext=(8, -3), fontsize=8)
    if ours.empty:
        no_data(axes[0][1])
        no_data(axes[1][1])
    else:
        order = label_order(ours["system"])
        for ax, value in ((axes[0][1], "samples_per_s"), (axes[1][1], "relative")):
            sns.lineplot(ours, x="oversubscription", y=value, hue="label", palette=palette, marker="o",
                         hue_order=order, estimator=ESTIMATOR, errorbar=ERRORBAR, err_style="bars", ax=ax)
        axes[0][1].set_ylim(bottom=0)
    axes[0][0].set_ylabel("samples / s")
    for ax in axes[1]:
        ax.axhline(1.0, color="0.25", linestyle="--", linewidth=1)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("")
    axes[1][0].set_ylabel("throughput per \\$ / pshard's")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set(xticks=RATIOS, xticklabels=[f"{r}:1" for r in RATIOS], xlim=(0.8, 10),
               xlabel="core oversubscription")
    rows = legend_below(fig, axes)
    return save(fig, out_dir, "oversubscription", legend_rows=rows)
