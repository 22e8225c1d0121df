#!/usr/bin/env python3
"""How close the server's fused aggregate+optimizer pass gets to memory bandwidth.

    python benchmarks/kernels.py [--elements N] [--repeats R] [--backend fast|reference]

Measures, on N float32 elements (default: ResNet-50's 25,549,486 parameters), single-threaded:

  copy          np.copyto(dst, src): the memory bandwidth yardstick, 2 x 4N bytes (read + write).
  fused         the last aggregation step fused with NAG, chunk by chunk in 8192-element chunks as
                the server does: nag(w[c], mom[c], acc[c], last[c], ...). It reads acc, last, w,
                mom and writes w, mom: 6 x 4N bytes.
  fused_whole   the same pass as one call over the whole arrays (no per-chunk call overhead).

Each is run once to warm up, then R times; the medians are reported. The last line of stdout is
a JSON object (fused_gbps, fused_whole_gbps, copy_gbps, ratio = fused_gbps / copy_gbps, ...).
"""
import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
from phub.reduction.kernels import get_backend  # noqa: E402

RESNET50_PARAMS = 25_549_486
CHUNK = 8192
# MXNet-like NAG hyperparameters; rescale_grad = 1/8 workers, gradient clipping off.
HP = dict(lr=0.01, momentum=0.9, wd=1e-4, rescale_grad=1 / 8, clip_gradient=-1.0)


def median_seconds(fn, repeats):
    fn()  # warm-up: page faults, caches, lazy initialisation
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=RESNET50_PARAMS,
                        help="float32 elements per array (default: ResNet-50, %(default)s)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (default 7)")
    parser.add_argument("--backend", default="fast", choices=["fast", "reference"])
    args = parser.parse_args(argv)
    n, repeats = args.elements, args.repeats
    if n < 1 or repeats < 1:
        parser.error("--elements and --repeats must be positive")
    k = get_backend(args.backend)

    rng = np.random.default_rng(0)
    src = rng.random(n, dtype=np.float32)
    dst = np.empty_like(src)
    # Small values so that repeated updates stay finite (no inf/NaN slow paths).
    w, mom, acc, last = (rng.random(n, dtype=np.float32) * np.float32(0.01) for _ in range(4))
    hp = tuple(HP.values())

    def copy():
        np.copyto(dst, src)

    def fused_chunked():
        nag = k.nag
        for lo in range(0, n, CHUNK):
            c = slice(lo, lo + CHUNK)
            nag(w[c], mom[c], acc[c], last[c], *hp)

    def fused_whole():
        k.nag(w, mom, acc, last, *hp)

    results = {}
    for name, fn, bytes_per_element in [("copy", copy, 2 * 4), ("fused", fused_chunked, 6 * 4),
                                        ("fused_whole", fused_whole, 6 * 4)]:
        seconds = median_seconds(fn, repeats)
        results[name] = (seconds, bytes_per_element * n)

    print(f"phub kernel benchmark: {n:,} float32 elements ({4 * n / 2**20:.1f} MiB per array), "
          f"backend={args.backend}, median of {repeats} after 1 warm-up, single thread")
    print(f"{'measurement':<44}{'time (ms)':>11}{'MB moved':>11}{'GB/s':>9}")
    labels = {"copy": "memory copy, np.copyto (2 x 4 B/elem)",
              "fused": f"fused aggregate+NAG, {CHUNK}-elem chunks (6 x 4)",
              "fused_whole": "fused aggregate+NAG, one call (6 x 4)"}
    gbps = {}
    for name, (seconds, nbytes) in results.items():
        gbps[name] = nbytes / seconds / 1e9
        print(f"{labels[name]:<44}{seconds * 1e3:>11.2f}{nbytes / 1e6:>11.1f}{gbps[name]:>9.2f}")
    ratio = gbps["fused"] / gbps["copy"]
    print(f"ratio fused (chunked) / copy bandwidth: {ratio:.3f} (target >= 0.6)")

    summary = {
        "fused_gbps": round(gbps["fused"], 3),
        "fused_whole_gbps": round(gbps["fused_whole"], 3),
        "copy_gbps": round(gbps["copy"], 3),
        "ratio": round(ratio, 3),
        "elements": n,
        "repeats": repeats,
        "chunk_elements": CHUNK,
        "backend": args.backend,
        "fused_ms": round(results["fused"][0] * 1e3, 3),
        "fused_whole_ms": round(results["fused_whole"][0] * 1e3, 3),
        "copy_ms": round(results["copy"][0] * 1e3, 3),
        "machine": platform.machine(),
        "numpy": np.__version__,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
