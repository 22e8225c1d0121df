# Shared by every rule: the grid of points and where results go.
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))
import points as grid  # noqa: E402

RESULTS = config.get("results_dir", "results")
POINTS = grid.by_key(config)
PYTHON = sys.executable
FIGURES = ["speedup", "capacity", "scaling", "cross_rack", "oversubscription", "breakdown",
           "chunk_sweep", "bandwidth"]


def point_outputs():
    return [f"{RESULTS}/points/{key}.csv" for key in POINTS]
