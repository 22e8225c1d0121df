#!/usr/bin/env python3
"""phub against its baselines on loopback: the same model, workers and compute, run alternately.

    python benchmarks/exchange_loopback.py [--model resnet50] [--workers 2] [--iterations 5]
        [--warmup 1] [--repeats 3] [--compute zero|replay] [--systems phub,pshard,...] [--out FILE]

Each repeat runs every system once, in turn (phub, pshard, pslite-central, pslite-shard,
gloo-ring), so slow drifts of a shared machine hit all systems alike. A system's figure is the
median over repeats of its run's median seconds per iteration; the ratios are phub's figure over
each other system's (below 1: phub is faster). A run during which the hypervisor of a virtual
machine took 5% or more of the cores' time says so (`steal_share`: each system's median share,
see experiments.monitor). The last line of stdout is one JSON object: {"seconds": {system: s},
"ratio_phub_over_<system>": r, "steal_share": {system: share}, ..., settings}. `--out FILE`
also writes it there (atomically) together with every run's row.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

from experiments.monitor import median_share, stolen_words
from experiments.runner import Options, run_exchange
from experiments.systems import SYSTEMS
from experiments.fileio import write_json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compute", choices=("zero", "replay"), default="zero")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated; phub must be one")
    parser.add_argument("--out", help="also write the summary and every row to this JSON file")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    if "phub" not in systems:
        parser.error("--systems must include phub (the ratios are phub's time over the others')")

    started = time.perf_counter()
    options = Options(compute=args.compute)
    rows = []
    for repeat in range(args.repeats):
        for system in systems:
            row = run_exchange(system, args.model, args.workers, args.iterations, args.warmup,
                               options=options, quiet=True)
            row["repeat"] = repeat
            rows.append(row)
            print(f"repeat {repeat}: {system:15s} {row['seconds_per_iteration'] * 1e3:8.1f} ms per iteration"
                  f"{stolen_words(row['bound'].get('cpu_steal'))}", file=sys.stderr, flush=True)

    seconds = {s: statistics.median(r["seconds_per_iteration"] for r in rows if r["system"] == s) for s in systems}
    print(f"\n{args.model}, {args.workers} workers, compute {args.compute}, median of {args.repeats} repeats "
          f"x {args.iterations} iterations:")
    print(f"{'system':15s} {'s/iteration':>12s} {'exchanges/s':>12s} {'phub/system':>12s}")
    for s in systems:
        print(f"{s:15s} {seconds[s]:12.4f} {args.workers / seconds[s]:12.2f} {seconds['phub'] / seconds[s]:12.3f}")
    summary = {"benchmark": "exchange_loopback", "model": args.model, "workers": args.workers,
               "compute": args.compute, "iterations": args.iterations, "repeats": args.repeats,
               "seconds": {s: round(v, 5) for s, v in seconds.items()},
               "steal_share": {s: median_share(r["bound"].get("cpu_steal") for r in rows if r["system"] == s)
                               for s in systems}}
    for s in systems:
        if s != "phub":
            summary[f"ratio_phub_over_{s}"] = round(seconds["phub"] / seconds[s], 3)
    summary.update(wall_seconds=round(time.perf_counter() - started, 1), host=platform.node(),
                   cpus=os.cpu_count())
    if args.out:
        write_json(args.out, {"summary": summary, "rows": rows}, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
