#!/usr/bin/env python3
"""Where a phub exchange's CPU time goes, by process role and kind of code, beside raw TCP's.

    python benchmarks/cpu_by_role.py [--model resnet50] [--workers 2] [--cores N] [--chunk-bytes B]
        [--exchanges 100] [--hz 1000] [--repeats 3] [--out FILE]

Runs phub's loopback exchange (compute removed, as `data_path.py` does) under Linux `perf record`
twice, `--exchanges` exchanges and a fifth of them, and divides the difference of every count
by the difference of exchanges: what start-up and the warm-up cost drops out. Every figure is the
median over `--repeats` such pairs (a cell near zero may come out slightly negative: start-up
varies from run to run). Each sample is put down to a role and a kind of code, as milliseconds
of CPU per exchange:

* roles: `server-core` (a process with one busy thread: a phub server core), `worker-io` (a
  worker's busiest thread besides its main one: the client's I/O thread, both workers summed),
  `worker-main` (the workers' main threads: the API calls and the harness around them);
* kinds: `kernel` (everything in the kernel: the sockets, mostly), `c-loops` (phub's C loops
  and kernels: the copies into place, the aggregation and optimizer pass), `memmove` (libc's
  copies: a core's first copies into their slots), `python` (the interpreter: bytecode and
  every object the C API makes, wherever it is called from), `numpy`, `other`.

Beside them, from the same run: raw TCP's CPU per exchange (`data_path.py`'s raw run in its
fastest layout: the same bytes between the same processes, no framing), the CPU an exchange 0.8
as fast as raw TCP may use when it keeps the cores as busy as raw TCP does (raw TCP's CPU / 0.8,
`budget_at_goal_ms`; `data_path.py` prints the same budget), and every system's CPU by side
(`by_side_ms`: raw TCP's receiver and workers, the ideal server's, phub's server cores and
workers), which says on which side phub spends what the others do not. The last line of stdout
is one JSON object; `--out FILE` also writes it there (atomically).

perf must be installed and allowed to sample every process (root, or
kernel.perf_event_paranoid <= 0); otherwise this exits with status 2 saying so.
"""
import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from data_path import GOAL_RATIO
from raw_tcp import best_raw_tcp
from experiments.models import load_model
from experiments.runner import Options
from experiments.fileio import write_json

ROLES = ("server-core", "worker-io", "worker-main")
KINDS = ("kernel", "c-loops", "memmove", "python", "numpy", "other")
_SAMPLE = re.compile(r"\s*(\d+)/(\d+)\s+\S+\s+(.*?)\s+\((.*)\)\s*$")  # pid/tid ip symbol (dso)
_EXCHANGE = ("import json, sys\n"
             "from experiments.runner import Options, run_exchanges\n"
             "options = Options(cores=int(sys.argv[4]), chunk_bytes=int(sys.argv[5]))\n"
             "row = run_exchanges('phub', sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 1, options=options,\n"
             "                    quiet=True)[0]\n"
             "print(json.dumps(row['seconds_per_iteration']))\n")


def kind_of(symbol: str, dso: str) -> str:
    name = os.path.basename(dso)
    if "kernel" in name:
        return "kernel"
    if name.startswith(("_fastpath", "_fastkernels")):
        return "c-loops"
    if name.startswith("libc") and "memmove" in symbol:
        return "memmove"
    if name.startswith("libpython"):
        return "python"
    if name.startswith("_multiarray"):
        return "numpy"
    return "other"


def samples_by_role(lines) -> dict:
    """Counts {role: {kind: samples}} of `perf script -F pid,tid,ip,sym,dso` output. A process's
    role comes from its threads: one busy thread, a server core; a second thread with at least
    5% of its samples, a worker (its main thread and its I/O thread, the busiest other one).
    Processes with under 2% of the samples (the launcher, the harness's parent) are left out."""
    per = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    for line in lines:
        match = _SAMPLE.match(line)
        if match:
            pid, tid, symbol, dso = match.groups()
            per[pid][tid][kind_of(symbol, dso)] += 1
    total = sum(sum(c.values()) for threads in per.values() for c in threads.values())
    counts = {role: collections.Counter() for role in ROLES}
    for pid, threads in per.items():
        sizes = {tid: sum(c.values()) for tid, c in threads.items()}
        if sum(sizes.values()) < 0.02 * total:
            continue
        others = sorted((tid for tid in threads if tid != pid), key=sizes.get, reverse=True)
        if others and sizes[others[0]] >= 0.05 * sum(sizes.values()):
            counts["worker-io"].update(threads[others[0]])
            counts["worker-main"].update(threads.get(pid, {}))
        else:
            counts["server-core"].update(threads.get(pid, {}))
    return counts


def sides(runs) -> dict:
    """The median CPU per exchange (ms) of raw runs' receiver and of their workers (`best_raw_tcp`)."""
    return {"server": round(statistics.median(run["echo_cpu"] for run in runs) * 1e3, 1),
            "workers": round(statistics.median(run["cpu"] - run["echo_cpu"] for run in runs) * 1e3, 1)}


def profile(model: str, workers: int, cores: int, chunk_bytes: int, exchanges: int, hz: int, folder: str):
    """One run of `exchanges` exchanges under perf: (counts by role and kind, seconds per exchange)."""
    data = os.path.join(folder, f"perf-{exchanges}.data")
    run = subprocess.run(["perf", "record", "-q", "-F", str(hz), "-o", data, "--", sys.executable, "-c", _EXCHANGE,
                          model, str(workers), str(exchanges), str(cores), str(chunk_bytes)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"perf record failed (exit {run.returncode}): {run.stderr.strip()[-400:]}")
    seconds = json.loads(run.stdout.strip().splitlines()[-1])
    script = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,ip,sym,dso"], capture_output=True,
                            text=True)
    if script.returncode != 0:
        raise RuntimeError(f"perf script failed (exit {script.returncode}): {script.stderr.strip()[-400:]}")
    return samples_by_role(script.stdout.splitlines()), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, help="phub server processes (default: one per worker, as data_path.py)")
    parser.add_argument("--chunk-bytes", type=int, default=Options().chunk_bytes, help="phub's chunk size")
    parser.add_argument("--exchanges", type=int, default=100, help="exchanges of the long run (the short: a fifth)")
    parser.add_argument("--hz", type=int, default=1000, help="perf's samples per second and CPU")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of perf runs, and raw TCP runs (medians)")
    parser.add_argument("--out", help="also write the summary to this JSON file")
    args = parser.parse_args()
    cores = args.workers if args.cores is None else args.cores
    short = args.exchanges // 5
    if args.workers < 2 or cores < 1 or short < 1 or args.hz < 1:
        parser.error("--workers must be at least 2, --cores and --hz at least 1, --exchanges at least 5")
    if shutil.which("perf") is None:
        print("cpu_by_role: needs Linux perf (`perf` is not on PATH; e.g. apt-get install linux-perf)",
              file=sys.stderr)
        return 2
    with open("/proc/sys/kernel/perf_event_paranoid") as f:
        paranoid = int(f.read())
    if paranoid > 0 and os.geteuid() != 0:
        print(f"cpu_by_role: perf may not sample other processes here (kernel.perf_event_paranoid is {paranoid}): "
              "run as root or set it to 0", file=sys.stderr)
        return 2

    per_exchange = 1e3 / args.hz / (args.exchanges - short)  # ms of CPU per sample and exchange
    tables, seconds = [], []
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            few, _ = profile(args.model, args.workers, cores, args.chunk_bytes, short, args.hz, folder)
            many, wall = profile(args.model, args.workers, cores, args.chunk_bytes, args.exchanges, args.hz, folder)
            tables.append({(role, kind): (many[role][kind] - few[role][kind]) * per_exchange
                           for role in ROLES for kind in KINDS})
            seconds.append(wall)
            print(f"repeat {repeat}: phub {wall * 1e3:.1f} ms per exchange, "
                  f"{sum(tables[-1].values()):.1f} ms of CPU", file=sys.stderr, flush=True)
    table = {role: {kind: round(statistics.median(t[role, kind] for t in tables), 1) for kind in KINDS}
             for role in ROLES}
    seconds = statistics.median(seconds)
    totals = {kind: round(sum(table[role][kind] for role in ROLES), 1) for kind in KINDS}
    nbytes = load_model(args.model).bytes
    raw = [best_raw_tcp(nbytes, args.workers) for _ in range(args.repeats)]
    ideal = [best_raw_tcp(nbytes, args.workers, update=True) for _ in range(args.repeats)]
    tcp_cpu = statistics.median(run["cpu"] for run in raw)
    by_side = {"raw_tcp": sides(raw), "ideal_server": sides(ideal),
               "phub": {"server": round(sum(table["server-core"].values()), 1),
                        "workers": round(sum(sum(table[role].values()) for role in ("worker-io", "worker-main")), 1)}}
    summary = {"benchmark": "cpu_by_role", "model": args.model, "workers": args.workers, "server_cores": cores,
               "chunk_bytes": args.chunk_bytes,
               "exchanges": args.exchanges, "phub_seconds_per_exchange": round(seconds, 5),
               "ms_per_exchange": table, "ms_per_exchange_all": totals,
               "phub_cpu_ms": round(sum(totals.values()), 1), "raw_tcp_cpu_ms": round(tcp_cpu * 1e3, 1),
               "budget_at_goal_ms": round(tcp_cpu / GOAL_RATIO * 1e3, 1), "by_side_ms": by_side}

    print(f"\n{args.model}, {args.workers} workers, {cores} server core(s), {args.chunk_bytes}-byte chunks: "
          f"ms of CPU per exchange "
          f"(perf, {args.exchanges} exchanges less {short}, medians of {args.repeats})")
    print(f"{'':14s}" + "".join(f"{kind:>9s}" for kind in KINDS) + f"{'all':>9s}")
    for role, row in [*table.items(), ("all", totals)]:
        print(f"{role:14s}" + "".join(f"{row[kind]:9.1f}" for kind in KINDS) + f"{sum(row.values()):9.1f}")
    print(f"raw TCP's processes: {summary['raw_tcp_cpu_ms']} ms per exchange; an exchange at {GOAL_RATIO} of raw "
          f"TCP's speed may use {summary['budget_at_goal_ms']}; phub used {summary['phub_cpu_ms']}")
    print("by side, ms of CPU per exchange (raw TCP and the ideal server from their own CPU counts, medians of "
          f"{args.repeats}):")
    for name, side in by_side.items():
        print(f"  {name:14s} server {side['server']:7.1f}   workers {side['workers']:7.1f}")
    if args.out:
        write_json(args.out, summary, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
