"""Every paper figure, ours and the paper's on the same axes: a registry of figure functions
and `render_all`.

Each figure function takes the tidy data (run rows; the convergence curves for `convergence`),
the reference tables and an output directory, writes `<name>.png` atomically and returns its path.
When a figure has no data of ours, its panel says "no data from this run" instead of failing.
`render` also writes the run's caption, `<name>.rst` beside the PNG (for Snakemake's
`report()`): the static caption `analysis/captions/<name>.rst` and one sentence counting our
points by what bounded them (the emulated network, this machine's CPU, or both).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Union

from . import fig_micro, fig_pbox, fig_rack, fig_softcost, normalize
from . import reference as reference_data
from .output import write_text
from .results import Results

CAPTION_DIR = Path(__file__).resolve().parent / "captions"

# name -> function, in the order of the paper's evaluation; the letters follow the project's brief
FIGURES: Dict[str, Callable[..., Path]] = {
    "speedup_end_to_end": fig_pbox.speedup_end_to_end,  # (a)
    "pbox_capacity": fig_pbox.pbox_capacity,  # (b)
    "scaling": fig_pbox.scaling,  # (c)
    "cross_rack": fig_rack.cross_rack,  # (d)
    "oversubscription": fig_rack.oversubscription,  # (e)
    "breakdown": fig_micro.breakdown,  # (f)
    "chunk_sweep": fig_micro.chunk_sweep,  # (g)
    "bandwidth_per_ps": fig_micro.bandwidth_per_ps,  # (h)
    "convergence": fig_micro.convergence,  # (i)
}
# Figures of our own experiments beside the paper's, drawn like the others (`render`, `--only`);
# a finished run is checked only for the paper's FIGURES.
OWN_FIGURES: Dict[str, Callable[..., Path]] = {
    "software_cost": fig_softcost.software_cost,  # the paper's breakdown measured at full speed
}
DRAWABLE = {**FIGURES, **OWN_FIGURES}


def caption_path(name: str) -> Path:
    """The caption file of figure `name`."""
    if name not in DRAWABLE:
        raise KeyError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
    return CAPTION_DIR / f"{name}.rst"


def caption(name: str) -> str:
    """The caption text of figure `name`."""
    return caption_path(name).read_text()


def bound_sentence(name: str, results: Results) -> str:
    """The run's sentence for the caption of figure `name`: our points counted by bound."""
    if name == "bandwidth_per_ps":
        return "Ours is computed from the layouts: no measured points."
    if name == "convergence":
        curves = results.convergence
        runs = 0 if curves.empty else len(curves.groupby(["framework", "workers"]))
        return f"Our curves: {runs} training run{'s' if runs != 1 else ''}; no exchange bound applies."
    if name == "software_cost":
        runs = results.software_cost
        count = 0 if runs.empty else len(runs.groupby(["system", "model", "message_setting"]))
        return (f"Our points: {count} runs on unshaped loopback, each bound by this machine's CPU by design "
                "(compute removed, links unshaped).")
    rows = normalize.FIGURE_ROWS[name](results.runs)
    return normalize.bound_sentence(normalize.point_bounds(rows))


def run_caption(name: str, results: Results) -> str:
    """The caption of figure `name` for this run: the static caption, then the bound count."""
    return caption(name).rstrip() + "\n\n*This run:* " + bound_sentence(name, results) + "\n"


def render(name: str, results: Results, out_dir: Union[str, Path], ref=None,
           compute_seconds: Optional[Mapping[str, float]] = None) -> Path:
    """Draw one figure into `out_dir` and write its run caption beside it (`<name>.rst`);
    return the PNG's path."""
    if name not in DRAWABLE:
        raise KeyError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
    ref = reference_data.load() if ref is None else ref
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if name == "convergence":
        path = fig_micro.convergence(results.convergence, ref, out_dir)
    elif name == "bandwidth_per_ps":
        path = fig_micro.bandwidth_per_ps(results.runs, ref, out_dir, compute_seconds=compute_seconds)
    elif name == "software_cost":
        path = fig_softcost.software_cost(results.software_cost, ref, out_dir)
    else:
        path = FIGURES[name](results.runs, ref, out_dir)
    write_text(out_dir / f"{name}.rst", run_caption(name, results))
    return path


def render_all(results: Results, out_dir: Union[str, Path], ref=None,
               compute_seconds: Optional[Mapping[str, float]] = None) -> Dict[str, Path]:
    """Draw every figure into `out_dir`; return name -> PNG path."""
    ref = reference_data.load() if ref is None else ref
    return {name: render(name, results, out_dir, ref, compute_seconds) for name in FIGURES}
