"""Shared look of every figure: ours and the paper's on the same axes (the paper's values hollow
on dashed lines, ours filled with the interquartile range of the repeats), one colour per system,
a mark on every point of ours that this machine's CPU bounded, and atomic PNG output."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from .output import atomic_write  # noqa: E402
from .reference import PAPER_TO_OURS, system_label  # noqa: E402

PAPER, OURS = "paper", "ours"
NO_DATA = "no data from this run"
ESTIMATOR = "median"
ERRORBAR = ("pi", 50)  # the 25th..75th percentile of the repeats: the interquartile range
DPI = 110

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)

# One colour per system, whichever name it appears under (paper's or ours).
_ORDER = ("phub", "pshard", "pslite-shard", "pslite-central", "gloo-ring", "MXNet-IB",
          "PSLite-IB-Shard", "Gloo-Halving-Doubling")
_PALETTE = sns.color_palette("colorblind", 10)
# indices into the palette, picked so that no two systems get look-alike colours; MXNet over
# InfiniBand is one system under two names (MXNet-IB, PSLite-IB-Shard), so one colour
_COLOURS = dict(zip(_ORDER, (_PALETTE[i] for i in (0, 1, 2, 5, 4, 7, 7, 9))))


def canonical(name: str) -> str:
    """Our name for a system where one exists, else the paper's."""
    return PAPER_TO_OURS.get(name) or name


def system_palette(names: Iterable[str]) -> Dict[str, Tuple[float, float, float]]:
    """Legend label -> colour for the given system names (paper's or ours)."""
    return {system_label(n): _COLOURS.get(canonical(n), (0.5, 0.5, 0.5)) for n in names}


def label_order(names: Iterable[str]) -> list:
    """Legend labels of `names` in the fixed system order."""
    rank = {n: i for i, n in enumerate(_ORDER)}
    unique = sorted(set(names), key=lambda n: (rank.get(canonical(n), len(rank)), n))
    return [system_label(n) for n in unique]


def panels(nrows: int = 1, ncols: int = 2, sharey: Union[bool, str] = True,
           size: Tuple[float, float] = (5.2, 3.6)):
    """A figure with nrows x ncols panels of `size` inches each."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows),
                             sharey=sharey, squeeze=False)
    return fig, axes


def no_data(ax, text: str = NO_DATA) -> None:
    """Mark a panel as having none of our data. An empty panel gets the text in its middle and no
    x ticks; a panel that already shows the paper's values gets "ours: <text>" along its top."""
    if ax.has_data():
        ax.text(0.5, 0.97, f"{OURS}: {text}", ha="center", va="top", transform=ax.transAxes, fontsize=9,
                color="0.35", style="italic")
        return
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11,
            color="0.35", style="italic", wrap=True)
    ax.set_xticks([])
    ax.tick_params(axis="y", labelleft=ax.get_subplotspec().is_first_col())


def plain_log(ax, axis: str = "y") -> None:
    """Log scale with plain numbers as tick labels (1000, not 10^3) at 1, 2 and 5 per decade,
    so that a range narrower than a decade still gets labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


# how a point of ours that was not bound by the emulated network is marked, over its filled marker
BOUND_MARKS = {"cpu": ("CPU-bound here: not comparable", "black")}


def paper_points(ax, x, y, colour, line: bool = True, label: Optional[str] = None) -> None:
    """The paper's values: hollow markers, on a dashed line when `line`."""
    ax.plot(x, y, linestyle="--" if line else "none", marker="o", markersize=7, markerfacecolor="white",
            markeredgecolor=colour, markeredgewidth=1.6, color=colour, linewidth=1.1, zorder=2, label=label)


def ours_points(ax, x, summary, colour, line: bool = True, label: Optional[str] = None) -> None:
    """Our values from `normalize.summarize`: filled markers at the median, interquartile range as
    error bars, on a solid line when `line`, and the CPU-bound ones marked (`mark_bounds`)."""
    x = np.asarray(x, dtype=float)
    med = summary["median"].to_numpy(dtype=float)
    low = np.clip(med - summary["q25"].to_numpy(dtype=float), 0, None)
    high = np.clip(summary["q75"].to_numpy(dtype=float) - med, 0, None)
    ax.errorbar(x, med, yerr=[low, high], fmt="-o" if line else "o", color=colour, markersize=6,
                capsize=3, linewidth=1.6, elinewidth=1, zorder=3, label=label)
    mark_bounds(ax, x, med, summary["bound"])


def mark_bounds(ax, x, y, bounds) -> None:
    """An "x" over every point whose bound is in BOUND_MARKS (cpu: black)."""
    bounds = np.asarray(list(bounds), dtype=object)
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    for bound, (_, colour) in BOUND_MARKS.items():
        chosen = bounds == bound
        if chosen.any():
            ax.scatter(x[chosen], y[chosen], marker="x", s=120, color=colour, linewidths=2.2, zorder=4)


def style_entries(bounds: Iterable[str] = ()) -> List[Tuple[object, str]]:
    """Legend entries for the two sources, and for each kind of marked point in `bounds`."""
    entries = [(Line2D([], [], linestyle="--", marker="o", color="0.3", markerfacecolor="white",
                       markeredgewidth=1.6), PAPER),
               (Line2D([], [], linestyle="-", marker="o", color="0.3"), f"{OURS} (median, IQR of repeats)")]
    present = set(bounds)
    for bound, (text, colour) in BOUND_MARKS.items():
        if bound in present:
            entries.append((Line2D([], [], linestyle="none", marker="x", markersize=9, color=colour,
                                   markeredgewidth=2.2), text))
    return entries


def system_entries(names: Sequence[str]) -> List[Tuple[object, str]]:
    """Legend entries, one coloured square per system, in the fixed order."""
    palette = system_palette(names)
    return [(Line2D([], [], linestyle="none", marker="s", markersize=9, color=palette[label]), label)
            for label in label_order(names)]


def dodge(index: int, count: int, width: float = 0.7) -> float:
    """Offset of the index-th of `count` series around a category's position."""
    return 0.0 if count <= 1 else (index - (count - 1) / 2) * width / count


def legend_below(fig, axes, title: str = "", columns: int = 3,
                 extra: Sequence[Tuple[object, str]] = (), after: Sequence[Tuple[object, str]] = ()) -> int:
    """One legend for the whole figure, under the panels: the `extra` (handle, label) pairs, every
    panel's labelled handles, then the `after` pairs. Returns how many rows it takes (for `save`)."""
    handles, labels = {}, []
    for handle, label in extra:
        if label not in handles:
            handles[label] = handle
            labels.append(label)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for handle, label in after:
        if label not in handles:
            handles[label] = handle
            labels.append(label)
    if not labels:
        return 0
    columns = min(len(labels), columns)
    fig.legend([handles[lbl] for lbl in labels], labels, loc="lower center", title=title or None,
               ncol=columns, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return -(-len(labels) // columns) + (1 if title else 0)


def save(fig, out_dir: Union[str, Path], name: str, legend_rows: int = 0) -> Path:
    """Write the figure to `out_dir/name.png` atomically and close it; return the path."""
    bottom = (0.1 + 0.27 * legend_rows) / fig.get_figheight()  # a legend row is ~0.27 inch
    fig.tight_layout(rect=(0, bottom, 1, 1))
    path = Path(out_dir) / f"{name}.png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format="png"))
    plt.close(fig)
    return path
