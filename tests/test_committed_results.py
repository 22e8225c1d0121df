"""The full runs committed under docs/results/ (the grid as configured; in chunks-8k/ the same
grid with 8 KB chunks; in slower-vm/ the grid as configured on a slower machine): complete,
within the hour, every verdict earned.

These read files only (no run): they keep the committed report honest as the analysis changes.
"""
import json
from functools import lru_cache
from pathlib import Path

import pytest

from analysis import report, results

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results"
RUNS = [DOCS, DOCS / "chunks-8k", DOCS / "slower-vm"]


@lru_cache(maxsize=None)
def _loaded(run: Path):
    """A committed run's results, read once for all the tests below (reading them takes seconds)."""
    return results.load(run / "points")


def test_the_committed_results_stay_small():
    size = sum(p.stat().st_size for p in DOCS.rglob("*") if p.is_file())
    assert size < 10 * 2**20, f"docs/results holds {size / 2**20:.1f} MiB"


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_committed_run_has_its_record_and_fits_the_hour(run):
    record = json.loads((run / "run.json").read_text())
    for key in ("wall_seconds", "nproc", "cpu", "git_commit", "config"):
        assert record.get(key) not in (None, ""), key
    assert record["status"] == 0 and record["config"] == "config/config.yaml"
    assert 0 < record["wall_seconds"] <= 3600


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_verdict_of_the_committed_report_is_earned(run):
    loaded = _loaded(run)
    problems = report.check(loaded, run / "figures", run / "report.md", min_measured=40)
    assert problems == []


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_committed_point_says_what_bounded_it(run):
    runs = _loaded(run).runs
    points = runs[runs["experiment"] != "convergence"]
    assert len(points) > 0 and points["bound"].isin(["compute", "wire", "cpu", "other"]).all()
