"""An interrupted experiment point leaves no partial CSV and no emulated rack behind, and the
pipeline's rerun redoes only unfinished points. Needs root for the rack (CI runs as root)."""
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
def test_an_interrupted_point_leaves_no_csv_and_no_rack(tmp_path, sig):
    config = yaml.safe_load((ROOT / "config/quick.yaml").read_text())
    point = points.by_key(config)["scaling/phub-n2"]
    point.update(repeats=3, iterations=200)  # long enough to be interrupted mid-run
    spec = tmp_path / "point.json"
    spec.write_text(json.dumps(point))
    out = tmp_path / "points" / "scaling" / "phub-n2.csv"
    before = _namespaces()
    proc = subprocess.Popen([sys.executable, "workflow/scripts/run_point.py", "--point", str(spec), "--out", str(out)],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (_namespaces() - before):  # wait until the point's rack exists
        assert proc.poll() is None and time.monotonic() < deadline, "the point never brought its rack up"
        time.sleep(0.1)  # polling for the rack, not synchronizing with the job
    os.killpg(proc.pid, sig)  # what Ctrl-C (or a scheduler's SIGTERM) does to the whole group
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert not out.exists(), "a partial CSV was left"
    assert not list(out.parent.glob("*.csv*")) if out.parent.exists() else True
    assert _namespaces() - before == set(), "the rack was left behind"


def test_a_rerun_skips_finished_points(tmp_path):
    """Loopback, one tiny experiment: the first run measures, the second has nothing to do."""
    config = yaml.safe_load((ROOT / "config/quick.yaml").read_text())
    config.update(network="loopback", repeats=1, iterations=1, warmup=0, results_dir=str(tmp_path / "results"))
    # --configfile is merged over config/config.yaml: switch its other experiments off
    config["experiments"] = {name: {"enabled": False} for name in config["experiments"]}
    config["experiments"]["chunk_sweep"] = {"model": "googlenet", "chunk_kb": [32], "workers": 1,
                                            "interfaces": 1, "link_gbps": 10}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    target = str(tmp_path / "results" / "points" / "chunk_sweep" / "c32k.csv")
    command = [sys.executable, "-m", "snakemake", target, "--profile", "profiles/local", "--configfile", str(path)]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert Path(target).exists()
    second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0
    assert "Nothing to be done" in second.stdout + second.stderr
