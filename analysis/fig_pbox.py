"""Figures of the PBox evaluation: end-to-end speedups, one server's capacity, scaling in a rack.

Each function takes the tidy run rows, the reference tables (`analysis.reference.load()`) and an
output directory, and returns the path of the PNG that it wrote.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns

from phub.models import MODELS

from . import derive
from .plotting import ERRORBAR, ESTIMATOR, OURS, PAPER, label_order, legend_below, no_data, panels, save, system_palette
from .reference import system_label

SETTINGS = ("cloud10g", "ib56g")


def speedup_end_to_end(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (a): speedup over stock MXNet (pslite-shard) per model, one row per network setting."""
    paper = ref["speedup_end_to_end"].data.rename(columns={"network": "setting"})
    ours = derive.speedups(runs)
    for frame in (paper, ours):
        frame["label"] = frame["system"].map(system_label)
    palette = system_palette(set(paper["system"]) | set(ours["system"]))
    fig, axes = panels(len(SETTINGS), 2, sharey=True, size=(6.2, 3.0))
    for row, setting in enumerate(SETTINGS):
        for col, (source, data) in enumerate(((PAPER, paper), (OURS, ours))):
            ax = axes[row][col]
            subset = data[data["setting"] == setting]
            ax.set_title(f"{source} — {setting}")
            if subset.empty:
                no_data(ax)
                continue
            sns.barplot(subset, x="model", y="speedup", hue="label", order=list(MODELS),
                        hue_order=label_order(subset["system"]), palette=palette, ax=ax,
                        estimator=ESTIMATOR, errorbar=ERRORBAR if source == OURS else None,
                        capsize=0.15, err_kws={"linewidth": 1})
            ax.axhline(1.0, color="0.25", linestyle="--", linewidth=1,
                       label="pslite-shard = stock MXNet (the baseline, 1.0)")
            ax.set_xlabel("")
            ax.tick_params(axis="x", rotation=40, labelsize=8)
        axes[row][0].set_ylabel("speedup over stock MXNet")
    rows = legend_below(fig, axes)
    return save(fig, out_dir, "speedup_end_to_end", legend_rows=rows)


def pbox_capacity(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (b): what one server sustains. The paper counts PCIe cache-line transfers per second
    against active senders. Here it is exchanges per second per worker against active workers, one
    line per interface count. The units differ, so the y axes are not shared."""
    paper = ref["pbox_capacity"].data
    ours = derive.capacity(runs)
    fig, axes = panels(1, 2, sharey=False)
    left, right = axes[0]
    sns.lineplot(paper, x="senders", y="million_lines_per_s", hue="series", marker="o", ax=left,
                 palette="dark")
    left.axhline(1500, color="0.25", linestyle="--", linewidth=1, label="hard limit 1500 M/s (printed)")
    left.set(title=f"{PAPER} — PCIe cache-line transfers", xlabel="active senders",
             ylabel="million cache lines / s")
    left.set_ylim(bottom=0)
    left.legend(fontsize=8)
    right.set_title(f"{OURS} — exchanges per worker")
    if ours.empty:
        no_data(right)
    else:
        ours["interfaces"] = ours["interfaces"].map(lambda k: f"{k} interface{'s' if k != 1 else ''}")
        sns.lineplot(ours, x="workers", y="per_worker", hue="interfaces", marker="o", ax=right,
                     estimator=ESTIMATOR, errorbar=ERRORBAR, err_style="bars", palette="crest")
        right.set(xlabel="active workers", ylabel="exchanges / s per worker")
        right.set_ylim(bottom=0)
        right.legend(fontsize=8, title=f"model: {', '.join(sorted(ours['model'].unique()))}",
                     title_fontsize=8)
    return save(fig, out_dir, "pbox_capacity")


def scaling(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (c): exchanges/s of the whole job with compute removed, 1..8 workers, per system.
    Absolute rates depend on the (scaled) link rate and the model, so the y axes are not shared."""
    paper = ref["scaling_exchanges"].data
    ours = derive.scaling(runs)
    for frame in (paper, ours):
        frame["label"] = frame["system"].map(system_label)
    palette = system_palette(set(paper["system"]) | set(ours["system"]))
    fig, axes = panels(1, 2, sharey=False)
    left, right = axes[0]
    sns.lineplot(paper, x="workers", y="exchanges_per_s", hue="label", palette=palette, marker="o",
                 hue_order=label_order(paper["system"]), ax=left)
    left.set(title=f"{PAPER} (model not stated)", ylabel="exchanges / s (all workers)")
    right.set_title(OURS)
    if ours.empty:
        no_data(right)
    else:
        several = ours["model"].nunique() > 1
        sns.lineplot(ours, x="workers", y="exchanges_per_s", hue="label", palette=palette, marker="o",
                     hue_order=label_order(ours["system"]), style="model" if several else None,
                     estimator=ESTIMATOR, errorbar=ERRORBAR, err_style="bars", ax=right)
        right.set(title=f"{OURS} ({', '.join(sorted(ours['model'].unique()))})",
                  ylabel="exchanges / s (all workers)")
    for ax in (left, right):
        ax.set_xlabel("workers")
        ax.set_xlim(0.5, 8.5)
        ax.set_ylim(bottom=0)
    rows = legend_below(fig, axes)
    return save(fig, out_dir, "scaling", legend_rows=rows)
