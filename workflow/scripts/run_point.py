"""Measure one experiment point: `phub bench exchange --repeats N`, then one tidy CSV.

    python workflow/scripts/run_point.py --point POINT.json --out results/points/EXP/ID.csv
                                         [--progress results/progress.json]

The CSV appears only when every repeat succeeded (written to a temp file, then renamed), so an
interrupted run leaves no partial file and a rerun redoes exactly the unfinished points. On an
emulated network the bench brings one rack up for all the point's repeats (each repeat starts its
processes afresh) and takes it down at the end, also on failure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phub.fileio import write_csv

COLUMNS = ["experiment", "point", "system", "model", "workers", "racks", "interfaces", "cores", "chunk_bytes",
           "oversubscription", "network", "queueing", "setting", "link_gbps", "link_gbps_measured", "s_n", "s_m", "s_t",
           "compute", "variant", "repeat", "seconds_per_iteration", "exchanges_per_s", "samples_per_s",
           "bytes_per_worker", "verified", "git_commit", "host"]


def bench_argv(point: dict, spec_path: str = "") -> list:
    argv = [sys.executable, "-m", "phub", "bench", "exchange", "--json",
            "--system", point["system"], "--model", point["model"], "--workers", str(point["workers"]),
            "--iterations", str(point["iterations"]), "--warmup", str(point["warmup"]),
            "--repeats", str(point["repeats"]),
            "--compute", point["compute"], "--chunk-bytes", str(point["chunk_bytes"]),
            "--cores", str(point["cores"]), "--network", point["network"]]
    if point.get("variant"):
        argv += ["--variant", point["variant"]]
    if point.get("verify") and point.get("variant") != "no_optimizer":
        argv.append("--verify")  # checked against the oracle every iteration, outside the timing
    if point["network"] == "emulated":
        argv += ["--spec", spec_path]
        return argv
    if point["network"] == "hostfile":
        argv += ["--spec", point["hostfile"]]
    if point["system"] == "phub":  # loopback or real machines: the PBox's interfaces and racks, unshaped
        argv += ["--racks", str(point["racks"]), "--interfaces-count", str(point["interfaces"])]
    return argv


STOP_GRACE = 60.0  # seconds the bench gets to take its rack down after a stop signal


def run_bench(argv: list, on_row) -> int:
    """Run one `phub bench exchange` (all repeats of a point); call `on_row` with each JSON row as
    it arrives; return its exit status. On SIGINT/SIGTERM the signal is passed on and the bench
    is waited for (it tears its rack down first): killing it outright, as subprocess.run would,
    could leave the rack's namespaces behind."""
    # Its own session: a signal to our process group reaches it once, through us, not twice
    # (a second stop signal in the middle of its teardown could cut the teardown short).
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    stopping = []

    def forward(signum, frame):
        stopping.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for line in proc.stdout:  # ends when the bench exits (after its teardown, if stopped)
            if line.startswith("{") and not stopping:
                on_row(json.loads(line))
        proc.wait(STOP_GRACE)
        return 128 + stopping[0] if stopping else proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return ""


def _host(configured: dict) -> float:
    return float(configured.get("host", 0))


def _host_measured(extra: dict) -> float:
    return float(extra.get("measured_mbit", {}).get("host", {}).get("mean_mbit", 0))


def tidy_row(point: dict, repeat: int, result: dict, commit: str) -> dict:
    extra = result.get("cluster", {}) or {}  # an emulated rack's facts; empty on loopback
    scale = extra.get("scale", {})
    return {
        "experiment": point["experiment"], "point": point["id"], "system": point["system"], "model": point["model"],
        "workers": point["workers"], "racks": point["racks"], "interfaces": point["interfaces"],
        "cores": point["cores"], "chunk_bytes": point["chunk_bytes"], "oversubscription": point["oversubscription"],
        "network": point["network"], "queueing": extra.get("queueing", ""), "setting": point["setting"],
        "link_gbps": _host(extra.get("configured_mbit", {})) / 1000 if extra else "",
        "link_gbps_measured": _host_measured(extra) / 1000 if extra else "",
        "s_n": scale.get("network", 1), "s_m": scale.get("model", 1), "s_t": scale.get("time", 1),
        "compute": point["compute"], "variant": point["variant"], "repeat": repeat,
        "seconds_per_iteration": result["seconds_per_iteration"],
        # every worker completes one exchange per iteration: the rate of the whole job
        "exchanges_per_s": point["workers"] / result["seconds_per_iteration"],
        "samples_per_s": result.get("samples_per_s", ""), "bytes_per_worker": result["bytes_per_worker"],
        "verified": result.get("verified", False), "git_commit": commit, "host": platform.node(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", required=True, help="the point as JSON (a file path)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--progress", help="JSON list of every point's output path, for progress reports")
    args = parser.parse_args()
    point = json.loads(Path(args.point).read_text())
    label = f"{point['experiment']}/{point['id']}"
    if args.progress:
        print(progress_line(json.loads(Path(args.progress).read_text()), label), file=sys.stderr, flush=True)
    point_started = time.monotonic()
    commit = git_commit()
    rows = []
    since = [time.monotonic()]

    def record(result: dict) -> None:
        rows.append(tidy_row(point, len(rows), result, commit))
        print(f"{label}: repeat {len(rows)}/{point['repeats']}: {result['seconds_per_iteration'] * 1e3:.1f} ms "
              f"per iteration ({time.monotonic() - since[0]:.0f} s)", file=sys.stderr, flush=True)
        since[0] = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="phub-point-") as tmp:
        spec_path = os.path.join(tmp, "rack.json")
        Path(spec_path).write_text(json.dumps(point.get("rack", {})))
        status = run_bench(bench_argv(point, spec_path), record)  # every repeat, on one rack
        if status != 0 or len(rows) != point["repeats"]:
            print(f"{label}: failed (status {status}) after {len(rows)} of {point['repeats']} repeats",
                  file=sys.stderr)
            return 1
    write_csv(args.out, rows, COLUMNS)
    _log_duration(Path(args.out), time.monotonic() - point_started)
    return 0


def _log_duration(out: Path, seconds: float) -> None:
    # One line per finished point, beside the points: what the progress estimate averages.
    with open(out.parent.parent / "durations.log", "a") as log:
        log.write(f"{out} {seconds:.1f}\n")


def progress_line(outputs: list, label: str) -> str:
    """"[point K of N, about M min left] EXP/ID" from what is already on disk."""
    done = [p for p in outputs if Path(p).exists()]
    log = Path(outputs[0]).parent.parent / "durations.log" if outputs else None
    seconds = []
    if log and log.exists():
        seconds = [float(line.split()[-1]) for line in log.read_text().splitlines() if line.strip()]
    left = ""
    if seconds:
        left = f", about {sum(seconds) / len(seconds) * (len(outputs) - len(done)) / 60:.0f} min left"
    return f"[point {len(done) + 1} of {len(outputs)}{left}] {label}"


if __name__ == "__main__":
    sys.exit(main())
