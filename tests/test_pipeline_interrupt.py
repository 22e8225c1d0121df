"""An interrupted shape (points sharing one emulated rack) keeps its finished points' CSVs,
leaves no partial CSV and no rack behind, and the pipeline's rerun redoes only unfinished points.
Needs root for the rack (CI runs as root)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
import points  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="the emulated rack needs root and iproute2")


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("phub-")}


@needs_root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_shape_keeps_finished_points_and_leaves_no_partial_csv_and_no_rack(tmp_path, sig):
    """Two points on one rack: the first finishes, the second is interrupted mid-run. The first's
    CSV stays, the second has none, the rack is gone; a rerun measures only the second."""
    config = yaml.safe_load((ROOT / "config/quick.yaml").read_text())
    grid = points.by_key(config)
    first, second = grid["scaling/phub-n2"], dict(grid["scaling/gloo-ring-n2"])
    assert first["shape"] == second["shape"]
    first.update(repeats=1, iterations=1)
    second.update(repeats=3, iterations=300)  # long enough to be interrupted mid-run
    spec = tmp_path / "shape.json"
    spec.write_text(json.dumps([first, second]))
    results = tmp_path / "points"
    done_csv, cut_csv = results / "scaling" / "phub-n2.csv", results / "scaling" / "gloo-ring-n2.csv"
    before = _namespaces()
    command = [sys.executable, "workflow/scripts/run_shape.py", "--shape", str(spec), "--results", str(results),
               "--done", str(tmp_path / "shape.done")]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while not done_csv.exists():  # wait until the first point is done (the second is then running)
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.1)  # polling for the file, not synchronizing with the job
    os.killpg(proc.pid, sig)  # what Ctrl-C (or a scheduler's SIGTERM) does to the whole group
    proc.wait(timeout=90)
    assert proc.returncode != 0
    assert done_csv.exists(), "a finished point's CSV was lost"
    assert not cut_csv.exists(), "a partial CSV was left"
    assert not [p for p in results.rglob("*") if p.name.startswith(".")], "a temporary file was left"
    assert not (tmp_path / "shape.done").exists()
    assert _namespaces() - before == set(), "the rack was left behind"
    kept = done_csv.read_text()
    second.update(iterations=1, repeats=1)  # the rerun: the same first point, a short second one
    spec.write_text(json.dumps([first, second]))
    rerun = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert done_csv.read_text() == kept, "the finished point was measured again"
    assert "scaling/phub-n2" not in rerun.stderr and cut_csv.exists()
    assert _namespaces() - before == set()


def test_a_rerun_skips_finished_points(tmp_path):
    """Loopback, one tiny experiment: the first run measures, the second has nothing to do."""
    config = yaml.safe_load((ROOT / "config/quick.yaml").read_text())
    config.update(network="loopback", repeats=1, iterations=1, warmup=0, results_dir=str(tmp_path / "results"))
    # --configfile is merged over config/config.yaml: switch its other experiments off
    config["experiments"] = {name: {"enabled": False} for name in config["experiments"]}
    config["experiments"]["chunk_sweep"] = {"model": "googlenet", "chunk_kb": [32], "model_scale": 1, "workers": 1,
                                            "interfaces": 1, "link_gbps": 10}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    (shape,) = points.shapes(config)
    target = str(tmp_path / "results" / "shapes" / f"{shape}.done")
    command = [sys.executable, "-m", "snakemake", target, "--profile", "profiles/local", "--configfile", str(path)]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert Path(target).exists() and (tmp_path / "results" / "points" / "chunk_sweep" / "c32k.csv").exists()
    second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0
    assert "Nothing to be done" in second.stdout + second.stderr
