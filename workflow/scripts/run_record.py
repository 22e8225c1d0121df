"""Write RESULTS/run.json for a finished `make paper`: how long the whole run took, on what.

    python workflow/scripts/run_record.py --started EPOCH_SECONDS --status N [--configfile FILE]

Keys: wall_seconds (from --started, taken before the venv step, to now), status (snakemake's
exit status), nproc, cpu (model name), git_commit, config (the config files, in merge order),
started and finished (UTC), points (how many CSVs the results hold).
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.fileio import write_json  # noqa: E402

DEFAULT_CONFIG = "config/config.yaml"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--started", type=float, required=True, help="the run's start, seconds since the epoch")
    parser.add_argument("--status", type=int, required=True, help="snakemake's exit status")
    parser.add_argument("--configfile", default="", help="the config merged over config/config.yaml, if any")
    args = parser.parse_args()
    configs = [DEFAULT_CONFIG] + ([args.configfile] if args.configfile else [])
    results = "results"
    for path in configs:
        results = (yaml.safe_load(Path(path).read_text()) or {}).get("results_dir", results)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    now = time.time()
    record = {"wall_seconds": round(now - args.started, 1), "status": args.status, "nproc": os.cpu_count(),
              "cpu": cpu_model(), "git_commit": commit, "config": configs[-1], "configs": configs,
              "started": _utc(args.started), "finished": _utc(now),
              "points": len(list(Path(results, "points").rglob("*.csv")))}
    out = Path(results) / "run.json"
    write_json(out, record)
    print(f"{out}: {record['wall_seconds'] / 60:.1f} min, status {args.status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
