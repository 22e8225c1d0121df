# Shared by every rule: the grid of points and where results go.
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))
import points as grid  # noqa: E402

RESULTS = config.get("results_dir", "results")
POINTS = grid.by_key(config)
PYTHON = sys.executable
# One per paper figure (analysis/figures.py), plus the convergence check of the integrations.
FIGURES = ["speedup_end_to_end", "pbox_capacity", "scaling", "cross_rack", "oversubscription", "breakdown",
           "chunk_sweep", "bandwidth_per_ps", "convergence"]


def point_outputs():
    return [f"{RESULTS}/points/{key}.csv" for key in POINTS]


def all_results():
    """Every tidy CSV the figures and the report read (the analysis loads the whole folder)."""
    return point_outputs() + [RESULTS + "/points/convergence/curves.csv"]
