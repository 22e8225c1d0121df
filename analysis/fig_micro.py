"""Characterization and microbenchmark figures: time breakdown, chunk-size sweep, bandwidth per
PS by placement, and the convergence check."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from . import derive, normalize
from .plotting import (
    ERRORBAR,
    ESTIMATOR,
    OURS,
    PAPER,
    dodge,
    legend_below,
    no_data,
    ours_points,
    paper_points,
    panels,
    plain_log,
    save,
    style_entries,
    system_entries,
    system_palette,
)
from .reference import PAPER_MODEL, system_label

# Components named as the paper's chart names them; ours are compute, aggregator, optimizer and
# network_and_other. Shared names get the same colour in both panels.
_COMPONENTS = ("compute", "data_copies", "aggregator", "aggregator_and_optimizer", "optimizer",
               "sync_and_other", "network_and_other")
_COMPONENT_COLOURS = dict(zip(_COMPONENTS, sns.color_palette("Set2", len(_COMPONENTS))))
_PHASE_LABEL = {"before": "stock PS", "after": "PHub"}


def _stacked(ax, frame: pd.DataFrame, bar_column: str, models: Sequence[str],
             errors: Optional[pd.DataFrame] = None) -> None:
    """Stacked bars of `relative`, one group per model (at its position in `models`), one bar per
    value of `bar_column`; bars are labelled on the axis, models above their group."""
    ticks, labels = [], []
    for i, model in enumerate(models):
        rows = frame[frame["model"] == model]
        bars = list(dict.fromkeys(rows[bar_column]))
        for j, bar in enumerate(bars):
            width = 0.8 / len(bars)
            x = i - 0.4 + width * (j + 0.5)
            bottom = 0.0
            for component in _COMPONENTS:
                value = rows.loc[(rows[bar_column] == bar) & (rows["component"] == component), "relative"].sum()
                if value > 0:
                    ax.bar(x, value, width * 0.9, bottom=bottom, color=_COMPONENT_COLOURS[component],
                           label=component, edgecolor="white", linewidth=0.5)
                    bottom += value
            if errors is not None:
                spread = errors[(errors["model"] == model) & (errors["system"] == bar)]
                if not spread.empty:
                    lo, hi = spread["low"].iloc[0], spread["high"].iloc[0]
                    ax.errorbar(x, bottom, yerr=[[max(bottom - lo, 0)], [max(hi - bottom, 0)]],
                                color="0.2", capsize=3, linewidth=1)
            ticks.append(x)
            labels.append(_PHASE_LABEL.get(bar, bar))
        # the model's name above its group; the same positions in both panels
        ax.text(i, 1.08, model, ha="center", va="bottom", fontsize=9)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, rotation=90, fontsize=8)
    ax.set(xlim=(-0.6, len(models) - 0.4), ylim=(0, 1.2))
    ax.grid(axis="x", visible=False)


def breakdown(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (f): left, PHub's whole iteration over the stock PS's for the same model, the
    paper's (hollow) and ours (filled) on the same axes; middle and right, where the time goes,
    stacked, each bar relative to the stock PS's whole iteration."""
    paper = ref["breakdown_mxnet_ps"].data.copy()
    paper["model"] = paper["model"].map(lambda m: PAPER_MODEL.get(m, m))
    totals = paper[paper["phase"] == "before"].groupby("model")["seconds"].sum()
    paper["relative"] = paper["seconds"] / paper["model"].map(totals)
    ours = derive.breakdown(normalize.usable(runs))
    ratios = normalize.summarize(normalize.breakdown(runs), ["model"], "ratio")
    paper_ratio = normalize.paper_breakdown(ref)
    fig, axes = panels(1, 3, sharey=False, size=(5.0, 4.0))
    compare, left, right = axes[0]
    models = list(dict.fromkeys(list(paper["model"]) + sorted(ours["model"].unique())
                                + sorted(ratios["model"].astype(str).unique())))
    position = {m: i for i, m in enumerate(models)}
    colour = system_palette(["phub"])[system_label("phub")]
    paper_points(compare, paper_ratio["model"].map(position), paper_ratio["ratio"], colour, line=False)
    if ratios.empty:
        no_data(compare)
    else:
        ours_points(compare, ratios["model"].map(position), ratios, colour, line=False)
    compare.axhline(1.0, color="0.25", linestyle=":", linewidth=1)
    compare.set_xticks(range(len(models)))
    compare.set_xticklabels(models, rotation=40, ha="right", fontsize=8)
    compare.set(title="PHub's iteration / stock PS's", ylabel="time per iteration / stock PS's",
                xlim=(-0.6, len(models) - 0.4))
    compare.set_ylim(bottom=0, top=max(1.1, compare.get_ylim()[1]))
    _stacked(left, paper, "phase", models)
    left.set(title=f"{PAPER}, by component", ylabel="time per iteration / stock PS's")
    right.set_title(f"{OURS}, by component")
    if ours.empty:
        no_data(right)
    else:
        # IQR of the repeats' whole iteration (full variant), on the bars' relative scale
        full = normalize.breakdown_rows(runs)
        full = full[full["variant"] == "full"]
        spread = full.groupby(["model", "system"])["seconds_per_iteration"].quantile([0.25, 0.75]).unstack()
        spread.columns = ["low", "high"]
        spread = spread.reset_index()
        stock = spread["model"].map(ours.groupby("model")["stock_total"].first())
        spread[["low", "high"]] = spread[["low", "high"]].div(stock, axis=0)
        _stacked(right, ours.sort_values(["model", "system"], key=_stock_first), "system", models, spread)
    entries = style_entries(ratios["bound"])
    rows = legend_below(fig, axes, columns=4, extra=entries)
    return save(fig, out_dir, "breakdown", legend_rows=rows)


def _stock_first(column: pd.Series) -> pd.Series:
    """Sort key that puts the stock PS before phub within a model (like the paper's chart)."""
    if column.name == "system":
        return column.map(lambda s: ("0" if s.startswith("pslite") else "1") + s)
    return column


def chunk_sweep(runs: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (g): samples/s relative to each curve's own peak against the paper-equivalent chunk
    size (ours: chunk_bytes_paper, or chunk_bytes x s_m), the paper's and ours on the same axes."""
    paper = normalize.paper_chunk_sweep(ref)
    values = normalize.chunk_sweep(runs)
    names = sorted(set(paper["system"]) | set(values["system"]))
    palette = system_palette(names)
    fig, axes = panels(1, 1, size=(7.6, 3.8))
    ax = axes[0][0]
    paper_points(ax, paper["chunk_bytes"], paper["normalized"], palette[system_label("phub")])
    for name in sorted(values["system"].unique()):
        mine = normalize.summarize(values[values["system"] == name], ["chunk_bytes_paper"], "normalized")
        ours_points(ax, mine["chunk_bytes_paper"], mine, palette[system_label(name)])
    if values.empty:
        no_data(ax)
    ax.axvline(32768, color="0.25", linestyle=":", linewidth=1, label="32 KB (PHub's chunk)")
    sizes = sorted(set(paper["chunk_bytes"]) | set(values["chunk_bytes_paper"].dropna().astype(int)))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([_kb(s) for s in sizes], rotation=45, fontsize=8)
    ax.minorticks_off()
    ax.set(xlabel="chunk size, paper-equivalent (ours: chunk bytes x s_m)",
           ylabel="samples / s, relative to the peak", ylim=(0, 1.1))
    entries = system_entries(names) + style_entries(values["bound"])
    rows = legend_below(fig, axes, extra=entries)
    return save(fig, out_dir, "chunk_sweep", legend_rows=rows)


def _kb(size: int) -> str:
    if size >= 1048576:
        return f"{size / 1048576:g} MB"
    return f"{size / 1024:g} KB" if size >= 1024 else f"{size} B"


def bandwidth_per_ps(runs: pd.DataFrame, ref, out_dir: Path,
                     compute_seconds: Optional[Mapping[str, float]] = None) -> Path:
    """Figure (h): Gbps one PS needs for 8 workers by placement, computed from phub's layouts and
    a compute time per iteration, on the same axes as the paper's printed table (hollow).
    Needs no measurements."""
    paper = ref["bandwidth_per_ps"].data.melt(id_vars="model", var_name="placement", value_name="gbps")
    paper["model"] = paper["model"].map(lambda m: PAPER_MODEL.get(m, m))
    models = list(dict.fromkeys(paper["model"]))
    ours = derive.bandwidth_table(ref, models, compute_seconds)
    position = {m: i for i, m in enumerate(models)}
    colours = dict(zip(derive.PLACEMENTS, sns.color_palette("muted", len(derive.PLACEMENTS))))
    fig, axes = panels(1, 1, size=(7.0, 4.0))
    ax = axes[0][0]
    for i, placement in enumerate(derive.PLACEMENTS):
        shift = dodge(i, len(derive.PLACEMENTS))
        theirs = paper[paper["placement"] == placement]
        paper_points(ax, theirs["model"].map(position) + shift, theirs["gbps"], colours[placement], line=False)
        mine = ours[ours["placement"] == placement]
        ax.plot(mine["model"].map(position) + shift, mine["gbps"], linestyle="none", marker="o", markersize=5,
                color=colours[placement], zorder=3, label=placement)
    plain_log(ax)
    times = ours.groupby("model")[["compute_seconds", "t_source"]].first()
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([f"{m}\nT={times.loc[m, 'compute_seconds']:.3g} s\n({times.loc[m, 't_source']})"
                        for m in models], fontsize=7)
    ax.set(title=f"{PAPER} (hollow) and {OURS}, computed for N=8 (filled)", ylabel="Gbps one PS needs")
    entries = style_entries()[:1] + [(style_entries()[1][0], f"{OURS} (computed)")]
    rows = legend_below(fig, axes, title="placement (C = colocated, NC = not; C = centralized, S = sharded)",
                        columns=4, extra=entries)
    return save(fig, out_dir, "bandwidth_per_ps", legend_rows=rows)


def convergence(curves: pd.DataFrame, ref, out_dir: Path) -> Path:
    """Figure (i): training loss per epoch, one panel per framework, one line per worker count.
    The paper shows no such curve, so there is no paper panel."""
    frameworks = sorted(curves["framework"].unique()) if not curves.empty else []
    fig, axes = panels(1, max(len(frameworks), 1), sharey=True, size=(4.4, 3.4))
    if not frameworks:
        no_data(axes[0][0])
        axes[0][0].set_title(f"{OURS} — convergence")
    for ax, framework in zip(axes[0], frameworks):
        data = curves[curves["framework"] == framework].copy()
        data["run"] = data["workers"].map(lambda n: "1 process (no PHub)" if n == 1 else f"{n} workers (PHub)")
        # the single-process reference wide and pale, so that PHub's runs show on top of it
        single, phub = data[data["workers"] == 1], data[data["workers"] != 1]
        if not single.empty:
            sns.lineplot(single, x="epoch", y="loss", hue="run", palette=["0.55"], linewidth=5, alpha=0.5,
                         estimator=ESTIMATOR, errorbar=None, ax=ax)
        if not phub.empty:
            order = [r for _, r in sorted(set(zip(phub["workers"], phub["run"])))]
            sns.lineplot(phub, x="epoch", y="loss", hue="run", hue_order=order, style="run", markers=True,
                         dashes=True, estimator=ESTIMATOR, errorbar=ERRORBAR, err_style="bars", ax=ax,
                         palette="flare")
        ax.set(title=f"{OURS} — {framework}", ylabel="training loss")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        plain_log(ax)
    rows = legend_below(fig, axes)
    return save(fig, out_dir, "convergence", legend_rows=rows)
