"""The pipeline's configuration and plan: schema validation, the experiment grid, a dry run."""
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
import points  # noqa: E402

CONFIGS = ["config/config.yaml", "config/quick.yaml"]
SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
EXPERIMENTS = {"pbox", "capacity", "scaling", "cross_rack", "oversubscription", "breakdown", "chunk_sweep"}


def load(name):
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize("name", CONFIGS)
def test_configs_validate_and_cover_every_experiment(name):
    config = load(name)
    jsonschema.validate(config, SCHEMA)
    grid = points.points(config)
    assert {p["experiment"] for p in grid} == EXPERIMENTS
    keys = [f"{p['experiment']}/{p['id']}" for p in grid]
    assert len(keys) == len(set(keys)), "point ids must be unique"
    for p in grid:
        assert p["workers"] == p["rack"]["racks"] * p["rack"]["workers_per_rack"], p["id"]


def test_the_grid_follows_the_config():
    config = load("config/quick.yaml")
    config["experiments"] = {"scaling": {"model": "resnet50", "workers": [1, 3], "systems": ["phub", "gloo-ring"],
                                         "interfaces": 2, "link_gbps": 10}}
    grid = points.points(config)
    # gloo-ring over one worker would allreduce nothing: the grid leaves it out
    assert [(p["system"], p["workers"]) for p in grid] == [("phub", 1), ("phub", 3), ("gloo-ring", 3)]
    assert all(p["compute"] == "zero" for p in grid)  # scaling removes compute, as the paper did


def _dry_run(tmp_path, config):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path),
                           "--config", f"results_dir={tmp_path / 'results'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_bad_value_stops_the_run_before_anything_starts_and_names_the_key(tmp_path):
    config = load("config/quick.yaml")
    config["experiments"]["scaling"]["systems"] = ["phub", "nccl"]
    run = _dry_run(tmp_path, config)
    assert run.returncode != 0
    assert "nccl" in run.stdout + run.stderr and "systems" in run.stdout + run.stderr
    assert not (tmp_path / "results").exists()


def test_dry_run_plans_every_point_figure_and_the_report(tmp_path):
    config = load("config/quick.yaml")
    run = _dry_run(tmp_path, config)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    planned = out.count("rule run_point:")
    assert planned == len(points.points(config))
    for rule in ("provision", "build", "convergence", "report", "figure_scaling", "figure_cross_rack"):
        assert f"rule {rule}:" in out, rule


def test_network_hostfile_needs_a_hostfile_and_passes_it_to_every_point():
    import run_point

    config = dict(load("config/quick.yaml"), network="hostfile")
    with pytest.raises(jsonschema.ValidationError, match="hostfile"):
        jsonschema.validate(config, SCHEMA)
    config["hostfile"] = "hosts.yaml"
    jsonschema.validate(config, SCHEMA)
    grid = points.points(config)
    phub_point = next(p for p in grid if p["system"] == "phub" and p["experiment"] == "cross_rack" and p["racks"] == 2)
    argv = run_point.bench_argv(phub_point)
    assert argv[argv.index("--network") + 1] == "hostfile" and argv[argv.index("--spec") + 1] == "hosts.yaml"
    assert argv[argv.index("--racks") + 1] == "2"
    gloo = run_point.bench_argv(next(p for p in grid if p["system"] == "gloo-ring"))
    assert "--racks" not in gloo and gloo[gloo.index("--spec") + 1] == "hosts.yaml"
