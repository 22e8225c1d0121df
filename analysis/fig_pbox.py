"""Figures of the PBox evaluation: end-to-end speedups, one server's capacity, scaling in a rack.

Each function takes the tidy run rows, the reference tables (`analysis.reference.load()`) and an
output directory, and returns the path of the PNG that it wrote. The first panel of each puts our
normalized values and the paper's on the same axes (see `analysis.normalize`).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns

from experiments.layouts import MODELS

from . import normalize
from .plotting import (
    OURS,
    PAPER,
    canonical,
    dodge,
    label_order,
    legend_below,
    no_data,
    ours_points,
    paper_points,
    panels,
    save,
    style_entries,
    system_entries,
    system_palette,
)
from .reference import system_label

SETTINGS = ("cloud10g", "ib56g")


def _colour(name: str):
    return system_palette([name])[system_label(name)]


def speedup_end_to_end(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (a): speedup over stock MXNet (pslite-shard) per model, one panel per network
    setting; the paper's speedups (hollow) beside ours (filled) on the same axes."""
    paper = normalize.paper_speedup(ref)
    paper["system"] = paper["system"].map(canonical)
    ours = normalize.summarize(normalize.speedup(runs), ["model", "setting", "system"], "speedup")
    systems = label_order(set(paper["system"]) | set(ours["system"]))
    names = sorted(set(paper["system"]) | set(ours["system"]), key=lambda n: systems.index(system_label(n)))
    models = [m for m in MODELS if m in set(paper["model"]) | set(ours["model"])]
    position = {m: i for i, m in enumerate(models)}
    fig, axes = panels(1, len(SETTINGS), sharey=True, size=(6.4, 3.8))
    for ax, setting in zip(axes[0], SETTINGS):
        ax.set_title(f"{setting}: {PAPER} (hollow) and {OURS} (filled)")
        for i, name in enumerate(names):
            shift = dodge(i, len(names))
            theirs = paper[(paper["setting"] == setting) & (paper["system"] == name)]
            if not theirs.empty:
                paper_points(ax, theirs["model"].map(position) + shift, theirs["speedup"], _colour(name), line=False)
            mine = ours[(ours["setting"] == setting) & (ours["system"] == name)]
            mine = mine[mine["model"].isin(position)]
            if not mine.empty:
                ours_points(ax, mine["model"].map(position) + shift, mine, _colour(name), line=False)
        ax.axhline(1.0, color="0.25", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=40, fontsize=8, ha="right")
        if ours[ours["setting"] == setting].empty:
            no_data(ax)
    top = max([1.0] + list(paper["speedup"].dropna()) + list(ours["q75"].dropna().astype(float)))
    axes[0][0].set_ylim(0, top * 1.08)
    axes[0][0].set_ylabel("speedup over stock MXNet\n(pslite-shard = 1, dotted)")
    entries = system_entries(names) + style_entries(ours["bound"])
    rows = legend_below(fig, axes, extra=entries, columns=4)
    return save(fig, out_dir, "speedup_end_to_end", legend_rows=rows)


def pbox_capacity(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (b): what one server sustains, as a share of its ceiling against active senders:
    the paper's PCIe cache-line transfers over the printed 1500 M/s limit, and our server's total
    exchanges/s over its highest median (per interface count). Right: ours per worker."""
    paper = normalize.paper_capacity(ref)
    values = normalize.capacity(runs)
    fig, axes = panels(1, 2, sharey=False)
    left, right = axes[0]
    left.set_title("share of one server's ceiling")
    series = list(dict.fromkeys(paper["series"]))
    for name, colour in zip(series, sns.color_palette("dark", len(series))):
        rows = paper[paper["series"] == name].sort_values("senders")
        paper_points(left, rows["senders"], rows["share"], colour, label=f"{PAPER}: {name} / 1500 M lines/s")
    left.axhline(1.0, color="0.25", linestyle=":", linewidth=1)
    right.set_title(f"{OURS}: exchanges / s per worker")
    interfaces = sorted(values["interfaces"].dropna().unique())
    colours = dict(zip(interfaces, sns.color_palette("crest", max(len(interfaces), 1))))
    if values.empty:
        no_data(right)
        no_data(left)
    for k in interfaces:
        rows = values[values["interfaces"] == k]
        text = f"{OURS}: {k} interface{'s' if k != 1 else ''}"
        share = normalize.summarize(rows, ["workers"], "share")
        ours_points(left, share["workers"], share, colours[k], label=f"{text} / its peak")
        per = normalize.summarize(rows, ["workers"], "per_worker")
        ours_points(right, per["workers"], per, colours[k], label=text)
    left.set(xlabel="active senders (paper) / workers (ours)", ylabel="throughput / ceiling")
    left.set_ylim(0, 1.5)
    if not values.empty:
        right.set(xlabel="active workers", ylabel="exchanges / s per worker")
        right.set_ylim(bottom=0)
        right.text(0.98, 0.02, f"model: {', '.join(sorted(values['model'].astype(str).unique()))}",
                   transform=right.transAxes, ha="right", fontsize=8)
    rows = legend_below(fig, axes, columns=2, after=style_entries(values["bound"])[2:])
    return save(fig, out_dir, "pbox_capacity", legend_rows=rows)


def scaling(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (c): scaling inside a rack with compute removed. Left: per-worker efficiency (rate
    per worker over the same system's rate per worker at its fewest workers; 1 = linear). Middle:
    each system's rate over PHub's at the same worker count. Right: our absolute rates."""
    paper = normalize.paper_scaling(ref)
    values = normalize.scaling(runs)
    names = sorted(set(paper["system"]) | set(values["system"]),
                   key=lambda n: label_order(set(paper["system"]) | set(values["system"])).index(system_label(n)))
    fig, axes = panels(1, 3, sharey=False, size=(4.6, 3.6))
    efficiency, over, absolute = axes[0]
    over_values = values.assign(bound=values["over_phub_bound"])
    for name in names:
        colour = _colour(name)
        theirs = paper[paper["system"] == name].sort_values("workers")
        mine = values[values["system"] == name]
        paper_points(efficiency, theirs["workers"], theirs["efficiency"], colour)
        paper_points(over, theirs["workers"], theirs["over_phub"], colour)
        for model in sorted(mine["model"].astype(str).unique()):
            rows = mine[mine["model"].astype(str) == model]
            for ax, frame, value in ((efficiency, rows, "efficiency"),
                                     (over, over_values.loc[rows.index], "over_phub"),
                                     (absolute, rows, "exchanges_per_s")):
                summary = normalize.summarize(frame, ["workers"], value)
                ours_points(ax, summary["workers"], summary, colour)
    efficiency.set(title="per-worker efficiency (1 = linear)", ylabel="(rate / n) / (rate / n) at fewest")
    efficiency.axhline(1.0, color="0.25", linestyle=":", linewidth=1)
    over.set(title="each system over PHub", ylabel="exchanges / s over PHub's")
    over.axhline(1.0, color="0.25", linestyle=":", linewidth=1)
    models = ", ".join(sorted(values["model"].astype(str).unique()))
    absolute.set(title=f"{OURS}, absolute ({models})" if models else f"{OURS}, absolute",
                 ylabel="exchanges / s (all workers)")
    if values.empty:
        for ax in axes[0]:
            no_data(ax)
    for ax in axes[0]:
        ax.set_xlabel("workers")
        ax.set_xlim(0.5, max([8] + list(values["workers"].dropna().astype(int))) + 0.5)
        ax.set_ylim(bottom=0)
    entries = system_entries(names) + style_entries(set(values["bound"]) | set(values["over_phub_bound"]))
    rows = legend_below(fig, axes, extra=entries, columns=4)
    return save(fig, out_dir, "scaling", legend_rows=rows)
