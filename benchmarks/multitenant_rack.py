#!/usr/bin/env python3
"""Two jobs on one PBox: does one slow the other beyond its share of the links? (needs root)

    python benchmarks/multitenant_rack.py [--spec config/racks/tenants.yaml] [--model resnet50]
        [--iterations 8] [--warmup 2] [--repeats 3]

On an emulated rack whose workers split into two jobs (ranks 0..W/2-1 and W/2..W-1 of the rack),
one phub server on the PBox is started with both jobs registered (each with its own id and
token). Each repeat times job 1 alone, then both jobs at once, each on a fresh server; compute is
removed. A job's *share* is what the links leave it when both run: a worker's own link carries
its job's bytes alone, a PBox NIC carries 1/K of every running worker's bytes, so with W workers
on K NICs running together a job needs max(1, W / K) times as long as alone. The last line is a
JSON object with, per job, `slowdown` (time together / time alone, medians over repeats) and
`beyond_share` = slowdown / share: 1.0 means the jobs cost each other nothing but the links they
must share.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from experiments.multitenant import run_jobs, seconds_per_iteration
from experiments.rack.emulated import EmulatedRack

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "config" / "racks" / "tenants.yaml"))
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds each run may take (default 300)")
    args = parser.parse_args()
    started = time.perf_counter()
    alone, together = [], {1: [], 2: []}
    with EmulatedRack(args.spec) as cluster:
        if cluster.hierarchical or len(cluster.workers) % 2:
            parser.error(f"{args.spec}: the benchmark needs one rack with an even number of workers")
        params = {"model": args.model, "scale": cluster.extra["scale"], "compute": "zero", "variant": "full",
                  "iterations": args.iterations, "warmup": args.warmup, "verify": True,
                  "worker_class": "experiments.systems.phub:PHubWorker"}
        for repeat in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="phub-tenants-") as out:
                alone.append(seconds_per_iteration(run_jobs(cluster, (1,), params, os.path.join(out, "alone"),
                                                            args.time_limit)[1]))
                both = {job: seconds_per_iteration(ranks) for job, ranks in
                        run_jobs(cluster, (1, 2), params, os.path.join(out, "both"), args.time_limit).items()}
            for job in both:
                together[job].append(both[job])
            print(f"repeat {repeat}: job 1 alone {alone[-1] * 1e3:.1f} ms; together job 1 {both[1] * 1e3:.1f} ms, "
                  f"job 2 {both[2] * 1e3:.1f} ms", file=sys.stderr, flush=True)
        workers, nics = len(cluster.workers), len(cluster.servers[0].addresses)
        measured = cluster.extra.get("measured_mbit", {})
    share = max(1.0, workers / nics)
    base = statistics.median(alone)
    jobs = {}
    for job, times in together.items():
        slowdown = statistics.median(times) / base
        jobs[str(job)] = {"together_s": statistics.median(times), "slowdown": slowdown, "beyond_share": slowdown / share}
    print(f"\n{args.model}: two jobs of {workers // 2} workers on one PBox with {nics} NICs; job 1 alone "
          f"{base * 1e3:.1f} ms per exchange; the links leave each job 1/{share:g} of its alone speed")
    for job, row in jobs.items():
        print(f"job {job} together: {row['together_s'] * 1e3:.1f} ms ({row['slowdown']:.2f} x alone, "
              f"{row['beyond_share']:.2f} x its share)")
    summary = {"benchmark": "multitenant_rack", "spec": os.path.relpath(args.spec, ROOT), "model": args.model,
               "workers": workers, "pbox_interfaces": nics, "measured_mbit": measured, "alone_s": base,
               "share": share, "jobs": jobs, "repeats": args.repeats, "iterations": args.iterations,
               "host": platform.node(), "wall_seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
