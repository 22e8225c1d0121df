# Shared by every rule: the grid of points, its shapes (points sharing one rack) and where
# results go.
import json
import sys
from pathlib import Path

from phub.errors import ConfigError
from snakemake.settings.types import DeploymentMethod

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))
import points as grid  # noqa: E402

RESULTS = config.get("results_dir", "results")
ENV = "../../environment.yml"  # every rule's conda environment (--sdm conda on a cluster), from this folder
# A point its emulated rack would refuse stops the run here, in one line, before anything starts.
try:
    POINTS = grid.by_key(config)
except ConfigError as exc:
    sys.exit(f"config error: {exc}")
SHAPES = grid.shapes(config)
# Rules run Snakemake's own interpreter (the prepared venv), or with `--sdm conda` the `python`
# of the rule's conda environment (environment.yml).
_CONDA = DeploymentMethod.CONDA in (
    workflow.deployment_settings.deployment_method or ()
)
PYTHON = "python" if _CONDA else sys.executable
# One per paper figure (analysis/figures.py), plus the convergence check of the integrations.
FIGURES = [
    "speedup_end_to_end",
    "pbox_capacity",
    "scaling",
    "cross_rack",
    "oversubscription",
    "breakdown",
    "chunk_sweep",
    "bandwidth_per_ps",
    "convergence",
]


def results(path):
    """`path` inside the run's results folder (config `results_dir`)."""
    return f"{RESULTS}/{path}"


def point_outputs():
    return [results(f"points/{key}.csv") for key in POINTS]


def shape_outputs():
    return [results(f"shapes/{shape}.done") for shape in SHAPES]


# What the figures and the report wait for (the analysis loads the whole points folder): every
# shape done, and the convergence curves, whose folder's parent is the points folder.
CURVES = "points/convergence/curves.csv"


def points_folder(input):
    """The points folder of a rule with a `curves` input."""
    return str(Path(input.curves).parent.parent)


def software_cost_commands(wildcards, output):
    """One `bench software-cost` command per entry of the experiment's `runs`, joined by
    && (`true` where the config has none or disables it: the figure then says so)."""
    exp = config["experiments"].get("software_cost")
    if not exp or not exp.get("enabled", True):
        return "true"
    out = str(Path(output.done).parent.parent / "points" / "software_cost")
    common = f"--out {out} --workers {exp['workers']} --repeats {exp['repeats']} --block-mb {exp['block_mb']}"
    return " && ".join(
        f"{PYTHON} -m experiments bench software-cost {common} "
        f"--systems {' '.join(run['systems'])} --models {' '.join(run['models'])} "
        f"--chunk-kb {' '.join(map(str, run.get('chunk_kb', exp['chunk_kb'])))} "
        f"--bigarray-bounds {' '.join(map(str, run.get('bigarray_bound', exp['bigarray_bound'])))}"
        for run in exp["runs"]
    )
