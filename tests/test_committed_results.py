"""The full run committed under docs/results/: complete, within its hour, and every verdict earned.

These read files only (no run): they keep the committed report honest as the analysis changes.
"""
import json
from pathlib import Path

from analysis import report, results

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results"


def test_the_committed_run_has_its_record_and_fits_the_hour():
    record = json.loads((DOCS / "run.json").read_text())
    for key in ("wall_seconds", "nproc", "cpu", "git_commit", "config"):
        assert record.get(key) not in (None, ""), key
    assert record["status"] == 0 and record["config"] == "config/config.yaml"
    assert 0 < record["wall_seconds"] <= 3600
    size = sum(p.stat().st_size for p in DOCS.rglob("*") if p.is_file())
    assert size < 10 * 2**20, f"docs/results holds {size / 2**20:.1f} MiB"


def test_every_verdict_of_the_committed_report_is_earned():
    loaded = results.load(DOCS / "points")
    problems = report.check(loaded, DOCS / "figures", DOCS / "report.md", min_measured=40)
    assert problems == []


def test_every_committed_point_says_what_bounded_it():
    runs = results.load(DOCS / "points").runs
    points = runs[runs["experiment"] != "convergence"]
    assert len(points) > 0 and points["bound"].isin(["wire", "mixed", "cpu"]).all()
