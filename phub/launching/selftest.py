"""`phub selftest`: does this installation work as a parameter server?

Checks that the C kernels are built and runs one small job with `run_job` on loopback: a server
with 2 cores and 2 workers (`python -m phub.launching.selftest --worker`), each registering two
arrays (one over many chunks, one smaller than a chunk), pushing known gradients for `STEPS` steps with SGD
on the server, and comparing every result with the closed form. The numbers are small integers
times a power of two, so float32 holds them exactly and the comparison is exact. A wrong
aggregate, a lost chunk or an optimizer applied twice shows as a mismatch that names the key,
the step and the first wrong element.
"""
from __future__ import annotations

import json
import sys
from typing import Dict, List, Optional

import numpy as np

STEPS = 3
LEARNING_RATE = 0.25
WORKERS = 2
SIZES = {"big": 300_000, "small": 1000}  # elements: 1.2 MB over ~37 chunks of 32 KB, and one chunk
TIME_LIMIT = 120.0  # seconds for the whole job


def gradient(size: int, rank: int, step: int) -> np.ndarray:
    return ((rank + 1) * (step + 1) * (np.arange(size) % 7)).astype(np.float32)


def expected_weights(size: int, step: int) -> np.ndarray:
    """The weights after steps 0..step: w0 - lr * (sum over steps and workers of the gradients)."""
    w = np.ones(size, dtype=np.float64)
    for s in range(step + 1):
        w -= LEARNING_RATE * sum(gradient(size, r, s).astype(np.float64) for r in range(WORKERS))
    return w.astype(np.float32)


def worker() -> int:
    """One worker of the check; exits 1 naming the first mismatch."""
    import phub

    kv = phub.connect()
    weights: Dict[str, np.ndarray] = {key: np.ones(size, dtype=np.float32) for key, size in SIZES.items()}
    kv.init(list(weights), list(weights.values()))
    kv.set_optimizer(phub.SGD(learning_rate=LEARNING_RATE))
    for step in range(STEPS):
        for key, size in SIZES.items():
            kv.pushpull(key, gradient(size, kv.rank, step), out=weights[key])
        for key, size in SIZES.items():
            wrong = np.flatnonzero(weights[key] != expected_weights(size, step))
            if wrong.size:
                i = int(wrong[0])
                print(f"selftest: rank {kv.rank}, key {key!r}, step {step}: element {i} is {weights[key][i]}, "
                      f"expected {expected_weights(size, step)[i]} ({wrong.size} of {size} wrong)", file=sys.stderr)
                kv.close()
                return 1
    kv.close()
    return 0


def run() -> dict:
    """Run the check (blocks for at most `TIME_LIMIT` seconds); the JSON row `phub selftest` prints."""
    from ..config import JobSpec, ServerConfig
    from ..reduction.kernels import FAST_AVAILABLE
    from .launch import run_job

    config = ServerConfig(jobs=(JobSpec(0, WORKERS),), cores=2, once=True, timeout=60.0)
    result = run_job([sys.executable, "-m", "phub.launching.selftest", "--worker"], WORKERS, config,
                     stdout=sys.stderr, time_limit=TIME_LIMIT)
    verified = result.status == 0
    if not verified:
        print(f"selftest: {result.failed}", file=sys.stderr)
    return {"selftest": "ok" if verified and FAST_AVAILABLE else "failed", "fast_kernels": FAST_AVAILABLE,
            "verified": verified}


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m phub.launching.selftest [--worker]`: the check (what `phub selftest` runs), or one of its workers."""
    if (sys.argv[1:] if argv is None else argv) == ["--worker"]:
        return worker()
    row = run()
    print(json.dumps(row))
    return 0 if row["selftest"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
