# Shared by every rule: the grid of points, its shapes (points sharing one rack) and where
# results go.
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))
import points as grid  # noqa: E402

RESULTS = config.get("results_dir", "results")
POINTS = grid.by_key(config)
SHAPES = grid.shapes(config)
PYTHON = sys.executable
# One per paper figure (analysis/figures.py), plus the convergence check of the integrations.
FIGURES = ["speedup_end_to_end", "pbox_capacity", "scaling", "cross_rack", "oversubscription", "breakdown",
           "chunk_sweep", "bandwidth_per_ps", "convergence"]


def point_outputs():
    return [f"{RESULTS}/points/{key}.csv" for key in POINTS]


def shape_outputs():
    return [f"{RESULTS}/shapes/{shape}.done" for shape in SHAPES]


def all_results():
    """What the figures and the report wait for (the analysis loads the whole points folder):
    every shape done, and the convergence curves."""
    return shape_outputs() + [RESULTS + "/points/convergence/curves.csv"]
