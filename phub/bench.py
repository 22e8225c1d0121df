"""`phub bench exchange`: workers repeatedly pushpull a model's real gradient layout.

The parent starts a server and N worker processes (this module run with `--worker`). Each worker
registers the model's arrays, then per iteration pushes every array's gradient in reverse layer
order (as backward produces them) and waits for all new weights; only that exchange is timed.
With `--verify`, every worker checks every iteration's weights against a closed-form oracle:
worker r pushes (r+1)*P for a fixed dyadic pattern P, so the aggregate is exactly N(N+1)/2*P and
the expected weights are the reference NAG applied to it k times.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

from .errors import ConfigError
from .models import load_layout, layout_bytes
from .optim import NAG
from .server import JobSpec, ServerConfig

ENV_BENCH = "PHUB_BENCH"
VERIFY_RTOL = 1e-6


def _pattern(size: int, period: int, scale: float, offset: int) -> np.ndarray:
    """Small dyadic values: sums and products of a few of them are exact in float32."""
    return (((np.arange(size, dtype=np.int64) + offset) % period - period // 2) * scale).astype(np.float32)


def bench_optimizer(num_workers: int) -> NAG:
    return NAG(learning_rate=0.05, momentum=0.9, wd=1e-4, rescale_grad=1.0 / num_workers)


def worker_main() -> int:
    """One benchmark worker (run by `phub bench exchange` through the launcher)."""
    import phub
    from .kernels import get_backend

    params = json.loads(os.environ[ENV_BENCH])
    arrays = load_layout(params["model"])
    kv = phub.connect()
    rank, n = kv.rank, kv.num_workers
    keys = list(range(len(arrays)))
    weights = [(_pattern(a.elements, 13, 1 / 64, i) if rank == 0 else np.zeros(a.elements, np.float32))
               for i, a in enumerate(arrays)]
    kv.init(keys, weights)
    optimizer = bench_optimizer(n)
    kv.set_optimizer(optimizer)
    grads = [_pattern(a.elements, 17, 1 / 16, 3 * i) * np.float32(rank + 1) for i, a in enumerate(arrays)]
    verify = params["verify"]
    if verify:
        reference = get_backend("reference")
        total = np.float32(n * (n + 1) // 2)
        oracle = [_pattern(a.elements, 13, 1 / 64, i) for i, a in enumerate(arrays)]
        mismatch = [k for k in keys if not np.array_equal(weights[k], oracle[k])]
        if mismatch:
            raise SystemExit(f"rank {rank}: initial weights of keys {mismatch[:5]} differ from rank 0's")
        oracle_mom = [np.zeros_like(w) for w in oracle]
        sums = [_pattern(a.elements, 17, 1 / 16, 3 * i) * total for i, a in enumerate(arrays)]
    seconds: List[float] = []
    for iteration in range(params["warmup"] + params["iterations"]):
        start = time.perf_counter()
        handles = [kv.pushpull_async(k, grads[k], out=weights[k]) for k in reversed(keys)]
        for handle in handles:
            handle.wait()
        seconds.append(time.perf_counter() - start)
        if verify:
            for k in keys:
                optimizer.apply(reference, oracle[k], oracle_mom[k], sums[k], None, None, 1)
                err = np.max(np.abs(weights[k] - oracle[k]) / np.maximum(1.0, np.abs(oracle[k])))
                if err > VERIFY_RTOL:
                    raise SystemExit(f"rank {rank}: iteration {iteration + 1}, key {k} ({arrays[k].name}): "
                                     f"weights differ from the oracle by {err:.3g} (relative)")
    kv.close()
    _write_json_atomic(os.path.join(params["out_dir"], f"rank{rank}.json"),
                       {"rank": rank, "seconds": seconds, "verified": bool(verify)})
    return 0


def _write_json_atomic(path: str, obj) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def run_exchange(model: str, workers: int, iterations: int, warmup: int = 1, verify: bool = False,
                 cores: int = 1, interfaces=("127.0.0.1",), chunk_bytes: int = 32 * 1024,
                 timeout: float = 300.0, quiet: bool = False) -> Dict:
    """Run the phub exchange benchmark; return the result row (raises PHubError on failure)."""
    from .errors import PHubError
    from .launch import run_job

    if iterations < 1 or warmup < 0 or workers < 1:
        raise ConfigError("iterations must be >= 1, warmup >= 0 and workers >= 1")
    arrays = load_layout(model)
    config = ServerConfig(jobs=(JobSpec(0, workers),), interfaces=tuple(interfaces), cores=cores,
                          chunk_bytes=chunk_bytes, once=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="phub-bench-") as out_dir:
        params = {"model": model, "iterations": iterations, "warmup": warmup, "verify": verify, "out_dir": out_dir}
        sink = open(os.devnull, "w") if quiet else sys.stderr
        try:
            job = run_job([sys.executable, "-m", "phub.bench", "--worker"], workers, config,
                          extra_env={ENV_BENCH: json.dumps(params)}, stdout=sink, stderr=sys.stderr)
        finally:
            if quiet:
                sink.close()
        if job.status != 0:
            raise PHubError(f"the exchange benchmark failed: {job.failed}")
        ranks = [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(workers)]
    per_iteration = [max(r["seconds"][i] for r in ranks) for i in range(warmup, warmup + iterations)]
    median = statistics.median(per_iteration)
    return {
        "system": "phub", "model": model, "workers": workers, "cores": cores,
        "interfaces": len(interfaces), "chunk_bytes": chunk_bytes, "bytes_per_worker": layout_bytes(arrays),
        "iterations": iterations, "warmup": warmup, "seconds_per_iteration": median,
        "seconds_per_iteration_all": per_iteration, "exchanges_per_s": 1.0 / median,
        "gbit_per_s_per_worker": 2 * layout_bytes(arrays) * 8 / median / 1e9,
        "verified": bool(verify) and all(r["verified"] for r in ranks),
        "host": platform.node(), "python": platform.python_version(),
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(worker_main())
    sys.exit("usage: python -m phub.bench --worker (started by `phub bench exchange`)")
