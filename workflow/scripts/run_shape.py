"""Measure every point of one shape (points that share a rack spec): one rack, many points.

    python workflow/scripts/run_shape.py --shape SHAPE.json --results results/points
                                         --done results/shapes/SHAPE.done [--progress all.json]

On an emulated network the rack comes up once (namespaces, shaped links, the preflight check of
every link) and each point runs in it with fresh processes; it is torn down at the end, also on
failure or SIGINT/SIGTERM. Each point's CSV (results/points/EXPERIMENT/ID.csv) is written
atomically when its measurement is done, so a rerun skips finished points and redoes the rest;
points with the same measurement (`points.MEASUREMENT_KEYS`, e.g. a breakdown point that is also
a pbox point) are measured once and filed under each. The `--done` file is written last.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments.multitenant import run_tenants  # noqa: E402
from experiments.network import emulated_view  # noqa: E402
from experiments.runner import Options, run_exchanges  # noqa: E402
from phub.errors import PHubError  # noqa: E402
from experiments.fileio import write_csv, write_json  # noqa: E402
from tidy import COLUMNS, chunks_per_worker, git_commit, tidy_row  # noqa: E402


def options_for(point: dict) -> Options:
    return Options(compute=point["compute"], network=point["network"], cores=point["cores"],
                   num_interfaces=point["interfaces"], racks=point["racks"], chunk_bytes=point["chunk_bytes"],
                   variant=point.get("variant") or "full", spec=point.get("hostfile"),
                   simulated_racks=point.get("simulated_racks", 1))


def measure(point: dict, rack, log) -> list:
    """The point's result rows (one per repeat), on `rack` (an EmulatedRack that is up) or,
    without one, on the network its options name."""
    verify = bool(point.get("verify")) and point.get("variant") != "no_optimizer"
    if point["experiment"] == "multitenant":
        return run_tenants(rack, point, log)
    cluster = emulated_view(rack, point["system"]) if rack is not None else None
    return run_exchanges(point["system"], point["model"], point["workers"], point["iterations"], point["warmup"],
                         verify, options_for(point), quiet=True, repeats=point["repeats"], cluster=cluster)


def csv_path(results: Path, point: dict) -> Path:
    return results / point["experiment"] / f"{point['id']}.csv"


def finished(results: Path, point: dict) -> bool:
    """The point's CSV exists and holds this measurement (not one of an older grid)."""
    path = csv_path(results, point)
    if not path.exists():
        return False
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return bool(rows) and all(r.get("measurement") == point["measurement"] for r in rows)


def run_shape(points: list, results: Path, progress: list, log=sys.stderr) -> int:
    """Measure the unfinished points; 0 when every point of the shape has its CSV."""
    todo = [p for p in points if not finished(results, p)]
    if not todo:
        return 0
    commit = git_commit()
    rack_spec = todo[0].get("rack") if todo[0]["network"] == "emulated" else None
    with contextlib.ExitStack() as stack:
        rack = None
        if rack_spec is not None:
            from experiments.rack.emulated import EmulatedRack

            rack = EmulatedRack(rack_spec)
            stack.enter_context(rack)
        measured: dict = {}
        for point in todo:
            label = f"{point['experiment']}/{point['id']}"
            print(progress_line(progress, label, results), file=log, flush=True)
            started = time.monotonic()
            key = point["measurement"]
            try:
                if key not in measured:
                    measured[key] = (label, measure(point, rack, log))
                source, rows = measured[key]
            except PHubError as exc:
                print(f"{label}: failed: {exc}", file=log, flush=True)
                return 1
            chunks = chunks_per_worker(point["model"], rows[0].get("cluster", {}).get("scale"), point["chunk_bytes"])
            tidy = [tidy_row(point, row, commit, chunks, shared_with="" if source == label else source) for row in rows]
            write_csv(csv_path(results, point), tidy, COLUMNS)
            seconds = time.monotonic() - started
            bounds = ", ".join(sorted({r["bound"] or "?" for r in tidy}))
            print(f"{label}: {len(tidy)} repeats, median {statistics.median(r['seconds_per_iteration'] for r in tidy) * 1e3:.1f} "
                  f"ms per iteration, bound {bounds} ({seconds:.0f} s"
                  f"{'; measured as ' + source if source != label else ''})", file=log, flush=True)
            _log_duration(results, label, seconds)
    return 0


def _log_duration(results: Path, label: str, seconds: float) -> None:
    # One line per finished point, beside the points: what the progress estimate averages.
    with open(results / "durations.log", "a") as log:
        log.write(f"{label} {seconds:.1f}\n")


def progress_line(outputs: list, label: str, results: Path) -> str:
    """"[point K of N, about M min left] EXP/ID" from what is already on disk."""
    done = [p for p in outputs if Path(p).exists()]
    log = results / "durations.log"
    seconds = []
    if log.exists():
        seconds = [float(line.split()[-1]) for line in log.read_text().splitlines() if line.strip()]
    left = ""
    if seconds:
        left = f", about {sum(seconds) / len(seconds) * (len(outputs) - len(done)) / 60:.0f} min left"
    return f"[point {len(done) + 1} of {len(outputs)}{left}] {label}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, help="the shape's points as a JSON list (a file path)")
    parser.add_argument("--results", required=True, help="the points directory (results/points)")
    parser.add_argument("--done", required=True, help="written when every point of the shape has its CSV")
    parser.add_argument("--progress", help="JSON list of every point's CSV path, for progress reports "
                                           "(default: the shape's own points)")
    args = parser.parse_args()
    points = json.loads(Path(args.shape).read_text())
    # Without the grid's list, progress counts this shape's points.
    progress = (json.loads(Path(args.progress).read_text()) if args.progress
                else [str(csv_path(Path(args.results), point)) for point in points])
    try:
        status = run_shape(points, Path(args.results), progress)
    except KeyboardInterrupt:  # SIGINT, or SIGTERM turned into it by the rack: torn down by now
        print("stopped: the rack is down; finished points are kept, a rerun does the rest", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 (anything else: say where, and fail this shape only)
        traceback.print_exc()
        return 1
    if status == 0:
        write_json(args.done, {"points": [str(csv_path(Path(args.results), p)) for p in points]})
    return status


if __name__ == "__main__":
    sys.exit(main())
