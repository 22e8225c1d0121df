"""The SLURM profile plans the quick grid with the requests docs/slurm.md states (no SLURM needed:
a dry run); the cluster scripts parse. `make test-slurm` runs them for real."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(tmp_path, env):
    sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
    import points
    import yaml

    shape = points.by_key(yaml.safe_load((ROOT / "config/quick.yaml").read_text()))["scaling/phub-n2"]["shape"]
    target = tmp_path / "results" / "shapes" / f"{shape}.done"  # the job that measures scaling/phub-n2
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/cluster",
                           "--configfile", "config/quick.yaml", "--config", f"results_dir={tmp_path / 'results'}",
                           "--", str(target)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def _resources(out, rule):
    block = re.search(rf"^(local)?rule {rule}:\n(.*?)(?:\n\n|\Z)", out, re.M | re.S)
    assert block, f"rule {rule} not planned:\n{out}"
    line = re.search(r"resources: (.*)", block.group(2))
    return dict(kv.split("=", 1) for kv in line.group(1).split(", ")) if line else {}


def test_points_take_a_whole_node_and_the_environment_sets_partition_account_and_cores(tmp_path):
    run = _dry_run(tmp_path, {"PHUB_SLURM_PARTITION": "compute", "PHUB_SLURM_ACCOUNT": "proj",
                              "PHUB_SLURM_CPUS": "16"})
    assert run.returncode == 0, run.stdout + run.stderr
    point = _resources(run.stdout, "run_shape")
    assert point["slurm_extra"] == "--exclusive --mem=0" and point["mem_mb"] == "0"
    assert point["slurm_partition"] == "compute" and point["slurm_account"] == "proj"
    assert point["cpus_per_task"] == "16"
    build = _resources(run.stdout, "build")
    assert build["cpus_per_task"] == "1" and build["slurm_partition"] == "compute"


def test_defaults_fit_the_one_node_test_cluster(tmp_path):
    run = _dry_run(tmp_path, {})
    assert run.returncode == 0, run.stdout + run.stderr
    point = _resources(run.stdout, "run_shape")
    if "PHUB_SLURM_PARTITION" not in os.environ:
        assert point["slurm_partition"] == "debug"
    if "PHUB_SLURM_CPUS" not in os.environ:
        assert point["cpus_per_task"] == "2"


def test_a_hostfile_run_holds_the_hostfiles_nodes(tmp_path):
    # network: hostfile: a point's processes are srun steps of its shape's job, on the nodes it holds.
    run = _dry_run(tmp_path, {"PHUB_SLURM_NODELIST": "n1,n2,n3"})
    assert run.returncode == 0, run.stdout + run.stderr
    point = _resources(run.stdout, "run_shape")
    assert point["nodes"] == "3" and point["tasks"] == "3"
    assert point["slurm_extra"] == "--exclusive --mem=0 --nodelist=n1,n2,n3"
    assert "nodes" not in _resources(run.stdout, "build")


def test_the_cluster_scripts_parse():
    for script in ("slurm_localhost.sh", "slurm_netns.sh", "test_slurm.sh", "test_slurm_nodes.sh"):
        path = ROOT / "workflow" / "scripts" / script
        assert os.access(path, os.X_OK), f"{script} is not executable"
        subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    subprocess.run(["bash", "-n", str(ROOT / "workflow/scripts/slurm_common.sh")], check=True, timeout=30)  # sourced
    usage = subprocess.run([str(ROOT / "workflow/scripts/slurm_localhost.sh")], capture_output=True, text=True,
                           timeout=30)
    assert usage.returncode == 2 and "start|stop|status|env" in usage.stderr
