"""Figures beyond one rack: the overhead of several racks, and core oversubscription with cost.
Ours and the paper's on the same axes (the paper's hollow, ours filled; see analysis.normalize)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd
import seaborn as sns

from . import derive, normalize, racks
from .plotting import (
    OURS,
    PAPER,
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

RATIOS = (1, 2, 4, 8)


def cross_rack(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (d): overhead (%) of R racks over one rack. Left, the paper's method (one PBox
    simulating R racks) beside the paper's chart; right, our racks on the wire, with the overhead
    the reduce-scatter scheme's wire bound implies and the scheme replayed (analysis.racks), not
    comparable with the paper's."""
    paper = ref["cross_rack_overhead"].data
    values = normalize.cross_rack(runs)
    wire = racks.wire_rows(runs)
    models = sorted(set(paper["model"]) | set(values["model"].astype(str)))
    palette = dict(zip(models, sns.color_palette("colorblind", len(models))))
    fig, axes = panels(1, 2, sharey=False, size=(6.0, 3.8))
    left, right = axes[0]
    for model in models:
        theirs = paper[paper["model"] == model].sort_values("racks")
        if not theirs.empty:
            paper_points(left, theirs["racks"], theirs["overhead_pct"], palette[model], label=f"{model}, {PAPER}")
        for ax, series in ((left, derive.SIMULATED), (right, derive.WIRE)):
            chosen = values[(values["model"].astype(str) == model) & (values["series"] == series)]
            mine = normalize.summarize(chosen, ["racks"], "overhead_pct")
            if not mine.empty:
                ours_points(ax, mine["racks"].astype(float), mine, palette[model], label=f"{model}, {OURS}")
        bound = wire[wire["model"] == model].sort_values("racks")
        one = bound[bound["racks"] == 1]
        several = bound[bound["racks"] > 1]
        if len(several) and len(one):
            right.plot(several["racks"], (several["scheme_bound"] / float(one["seconds"].iloc[0]) - 1) * 100, ":",
                       color=palette[model], linewidth=1.4, label=f"{model}, the scheme's wire bound")
            right.plot(several["racks"], (several["replayed"] / float(one["seconds"].iloc[0]) - 1) * 100, "-.",
                       color=palette[model], linewidth=1.2, label=f"{model}, the scheme replayed")
    for ax, series, title in ((left, derive.SIMULATED, "one PBox simulating R racks (the paper's method)"),
                              (right, derive.WIRE, "R racks on the wire (ours)")):
        if values[values["series"] == series].empty:
            no_data(ax)
        ax.axhline(0.0, color="0.25", linestyle=":", linewidth=1)
        ax.set(title=title, xlabel="racks", xticks=range(2, 9), ylabel="overhead vs one rack (%)")
    rows = legend_below(fig, axes, columns=2, after=style_entries(values["bound"])[2:])
    return save(fig, out_dir, "cross_rack", legend_rows=rows)


def oversubscription(runs: pd.DataFrame, ref, out_dir: Path,
                     prices: Optional[pd.DataFrame] = None) -> Path:
    """Figure (e): left, throughput relative to the same system at 1:1 against the core's
    oversubscription (the paper's curve was not recovered); right, throughput per $ relative to
    the sharded PS at the same ratio, with the paper's 2:1 point (cost.csv) on the same axes."""
    paper = normalize.paper_per_dollar(ref)
    relative = normalize.oversubscription(runs)
    dollars = normalize.per_dollar(runs, prices)
    names = sorted(set(paper["system"]) | set(relative["system"]) | set(dollars["system"]))
    palette = system_palette(names)
    fig, axes = panels(1, 2, sharey=False)
    left, right = axes[0]
    for name in names:
        colour = palette[system_label(name)]
        mine = normalize.summarize(relative[relative["system"] == name], ["oversubscription"], "relative_to_1")
        if not mine.empty:
            ours_points(left, mine["oversubscription"], mine, colour)
        cost = normalize.summarize(dollars[dollars["system"] == name], ["oversubscription"], "relative")
        if not cost.empty:
            ours_points(right, cost["oversubscription"], cost, colour)
        theirs = paper[paper["system"] == name]
        if not theirs.empty:
            paper_points(right, theirs["oversubscription"], theirs["relative"], colour, line=False)
            for row in theirs.itertuples():
                right.annotate(f"{row.per_1000usd:g} / \\$1000", (row.oversubscription, row.relative),
                               textcoords="offset points", xytext=(8, -3), fontsize=8)
    left.text(0.5, 0.05, "the paper's throughput curve was not recovered", transform=left.transAxes,
              ha="center", fontsize=8, color="0.35", style="italic")
    if relative.empty:
        no_data(left)
    if dollars.empty:
        no_data(right)
    left.set(title="throughput over the same system's at 1:1", ylabel="samples / s over 1:1's")
    right.set(title="throughput per \\$ over pshard's (cost.csv at 2:1)", ylabel="throughput per \\$ / pshard's")
    for ax in (left, right):
        ax.axhline(1.0, color="0.25", linestyle=":", linewidth=1)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.6 if ax is right else 1.1))
        ax.set_xscale("log", base=2)
        ax.set(xticks=RATIOS, xticklabels=[f"{r}:1" for r in RATIOS], xlim=(0.8, 10),
               xlabel="core oversubscription")
    entries = system_entries(names) + style_entries(set(relative["bound"]) | set(dollars["bound"]))
    rows = legend_below(fig, axes, extra=entries)
    return save(fig, out_dir, "oversubscription", legend_rows=rows)
