#!/usr/bin/env python3
"""phub on an emulated rack against the wire bound and against gloo-ring (needs root).

    python benchmarks/rack_exchange.py [--spec config/racks/rack8.yaml] [--model resnet50]
        [--iterations 10] [--warmup 2] [--repeats 3] [--chunk-bytes N]

The default spec is one rack of 8 workers and a PBox with 8 NICs, every link at the same rate (the
paper's 10 Gbps divided by s_n = 200: 50 Mbit/s), compute removed. The wire bound of one exchange is
the (scaled) model's bytes over one link's rate: each worker must push its gradient and receive the
new weights over its own link, both at once on a full-duplex link, and the PBox's 8 NICs carry
exactly the 8 workers' bytes. A spec of R > 1 racks runs phub's two-phase reduction (phub only); its
wire bound is that of the reduce-scatter / all-gather between the racks (`reduce_scatter_bound`):
the busiest of a worker's link, a PBox NIC (its workers' share plus 2(R-1)/R of a model over the
PBox's NICs) and a rack's uplink (2(R-1)/R of a model), each direction at once. Chunks are by
default the paper's 32 KB divided by the spec's model scale, so a worker's model travels in the
paper's number of chunks (ResNet-50: 3,219). phub and gloo-ring run alternately, each on a fresh
rack, so a drifting machine hurts both alike; figures are medians over repeats of each run's median.
The last line of stdout is one JSON object with `wire_bound_ratio` (phub time / wire bound),
`over_floor` (the monitor's: phub time / the busiest link's measured bytes at its rate, headers
included), `gloo_over_phub` (gloo-ring time / phub time; null with racks) and `steal_share` (each
system's median share of the cores' time the hypervisor of a virtual machine took while it ran; a
run that lost 5% or more says so, see experiments.monitor).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from experiments.models import PAPER_CHUNK_BYTES, chunks_per_worker, load_model, scaled, scaled_chunk
from experiments.monitor import median_share, stolen_words
from experiments.rack.rackspec import load_spec
from experiments.runner import Options, run_exchange

ROOT = Path(__file__).resolve().parents[1]


def reduce_scatter_bound(spec, model_bytes: int) -> float:
    """Seconds per exchange on the busiest link of `spec` (RackSpec) when phub's racks reduce-scatter
    and all-gather `model_bytes` of payload (frame and packet headers left out): every worker's
    link carries a model each way; each PBox NIC its share of the rack's workers' models and of
    the 2(R-1)/R models the rack sends to (and receives from) the others; each uplink those."""
    racks = spec.racks
    between = 2 * (racks - 1) / racks * model_bytes  # per rack and direction, over all its NICs
    per_nic = (spec.workers_per_rack * model_bytes + between) / spec.pbox_interfaces
    seconds = [model_bytes * 8 / (spec.mbit("host") * 1e6), per_nic * 8 / (spec.mbit("pbox_nic") * 1e6)]
    if racks > 1:
        seconds.append(between * 8 / (spec.mbit("uplink") * 1e6))
    return max(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "config" / "racks" / "rack8.yaml"))
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    # one core: with 8 workers on a 2-core machine a second server process only adds contention
    parser.add_argument("--cores", type=int, default=1, help="phub server cores (default 1)")
    parser.add_argument("--compute", choices=("zero", "replay"), default="zero",
                        help="zero (default) or replay: the model's scaled compute time, overlapped as in training")
    parser.add_argument("--verify", action="store_true", help="check every result against the oracle")
    parser.add_argument("--chunk-bytes", type=int, default=None,
                        help="phub's chunk size (default: 32 KB / the spec's model scale, the paper's chunk count)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    chunk_bytes = args.chunk_bytes or scaled_chunk(PAPER_CHUNK_BYTES, spec.scale_model)
    chunks = chunks_per_worker(scaled(load_model(args.model), {"model": spec.scale_model, "time": 1}), chunk_bytes)
    workers = spec.num_workers
    started = time.perf_counter()
    rows = {"phub": [], "gloo-ring": []} if spec.racks == 1 else {"phub": []}  # racks: phub's two phases only
    for repeat in range(args.repeats):
        for system in rows:
            options = Options(compute=args.compute, network="emulated", spec=args.spec, cores=args.cores,
                              num_interfaces=spec.pbox_interfaces, racks=spec.racks, chunk_bytes=chunk_bytes)
            row = run_exchange(system, args.model, workers, args.iterations, args.warmup, verify=args.verify,
                               options=options, quiet=True)
            rows[system].append(row)
            print(f"repeat {repeat}: {system:10s} {row['seconds_per_iteration'] * 1e3:8.1f} ms per exchange"
                  f"{stolen_words(row['bound'].get('cpu_steal'))}", file=sys.stderr, flush=True)
    phub = statistics.median(r["seconds_per_iteration"] for r in rows["phub"])
    gloo = statistics.median(r["seconds_per_iteration"] for r in rows["gloo-ring"]) if "gloo-ring" in rows else None
    model_bytes = rows["phub"][0]["bytes_per_worker"]
    host_mbit = spec.mbit("host")
    wire_bound = reduce_scatter_bound(spec, model_bytes)
    over_floor = [r["bound"].get("over_floor") for r in rows["phub"]]
    over_floor = statistics.median(over_floor) if None not in over_floor else None
    cpu_busy = [r["bound"].get("cpu_busy") for r in rows["phub"]]
    measured = rows["phub"][0]["cluster"].get("measured_mbit", {})
    print(f"\n{args.model} scaled by {spec.scale_model:g}: {model_bytes / 1e6:.2f} MB per worker, {workers} workers "
          f"in {spec.racks} rack(s), {spec.pbox_interfaces} PBox NICs each, host links at {host_mbit:.0f} Mbit/s, "
          f"{chunk_bytes} B chunks ({chunks} per worker)")
    print(f"wire bound {wire_bound * 1e3:.1f} ms; phub {phub * 1e3:.1f} ms ({phub / wire_bound:.2f} x bound, "
          f"{over_floor} x the busiest link's measured bytes)"
          + (f"; gloo-ring {gloo * 1e3:.1f} ms ({gloo / phub:.2f} x phub)" if gloo is not None else ""))
    summary = {"benchmark": "rack_exchange", "spec": os.path.relpath(args.spec, ROOT), "model": args.model,
               "workers": workers, "racks": spec.racks, "compute": args.compute,
               "pbox_interfaces": spec.pbox_interfaces, "link_mbit": host_mbit, "measured_mbit": measured,
               "bytes_per_worker": model_bytes, "chunk_bytes": chunk_bytes,
               "chunks_per_worker": chunks, "wire_bound_s": wire_bound, "phub_s": phub, "gloo_ring_s": gloo,
               "wire_bound_ratio": phub / wire_bound, "over_floor": over_floor, "cpu_busy": cpu_busy,
               "gloo_over_phub": gloo / phub if gloo is not None else None,
               "steal_share": {system: median_share(r["bound"].get("cpu_steal") for r in runs)
                               for system, runs in rows.items()},
               "repeats": args.repeats, "iterations": args.iterations, "host": platform.node(),
               "wall_seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
