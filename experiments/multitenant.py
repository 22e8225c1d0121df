"""Two jobs on one PBox: does one slow the other beyond its share of the links?

On an emulated rack whose workers split into two jobs (ranks 0..W/2-1 and W/2..W-1 of the rack),
one phub server on the PBox serves both, each job with its own id and token. `run_jobs` runs one
or both jobs at once on a fresh server; `run_tenants` times job 1 alone, then both together, per
repeat. A job's *share* is what the links leave it when both run: a worker's own link carries its
job's bytes alone, a PBox NIC carries 1/K of every running worker's bytes, so with W workers on K
NICs running together a job needs max(1, W / K) times as long as alone.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

from phub.config import JobSpec, ServerConfig
from phub.errors import PHubError
from phub.launching.launch import run_job

from .models import load_model, scaled
from .monitor import Monitor, block, settle, summarize
from .runner import QUIET_TAIL_LINES, worker_pythonpath
from .worker import ENV_PARAMS

JOBS = ((1, "tenant-one"), (2, "tenant-two"))
WORKER_CLASS = "experiments.systems.phub:PHubWorker"


def run_jobs(cluster, jobs: Sequence[int], params: dict, out_dir: str, time_limit: float) -> Dict[int, List[dict]]:
    """Run `jobs` (job ids) at once on one server on the PBox (`phub.launching.launch.run_job` with several
    jobs); {job id: its ranks' results}. Blocks until every worker is done, at most `time_limit`
    seconds; raises PHubError naming the failed worker or job, or the limit passing, followed by
    the run's last output."""
    half = len(cluster.workers) // 2
    specs = tuple(JobSpec(job, half, token) for job, token in JOBS if job in jobs)
    config = ServerConfig(jobs=specs, cores=1, once=True, timeout=time_limit)
    servers = cluster.servers[:1]
    job_cluster = dataclasses.replace(cluster, servers=servers, workers=cluster.workers[:half * len(specs)])
    job_env = {}
    for spec in specs:
        os.makedirs(os.path.join(out_dir, f"job{spec.job_id}"), exist_ok=True)
        job_env[spec.job_id] = {ENV_PARAMS: json.dumps(dict(params, out_dir=os.path.join(out_dir, f"job{spec.job_id}")))}
    with tempfile.TemporaryFile("w+", errors="replace") as output:
        result = run_job([sys.executable, "-m", "experiments.worker"], half * len(specs), config, cluster=job_cluster,
                         extra_env={"PYTHONPATH": worker_pythonpath()}, job_env=job_env, stdout=output, stderr=output,
                         time_limit=time_limit, torch_vars=False)
        if result.status != 0:
            output.seek(0)
            tail = "".join(output.readlines()[-QUIET_TAIL_LINES:])
            raise PHubError(f"jobs {list(jobs)}: {result.failed}\n--- last output of the run ---\n{tail}")
    results = {}
    for job in jobs:
        ranks = [json.loads(Path(out_dir, f"job{job}", f"rank{r}.json").read_text()) for r in range(half)]
        if not all(r["verified"] for r in ranks):
            raise PHubError(f"job {job}: results did not verify")
        results[job] = ranks
    return results


def seconds_per_iteration(ranks: List[dict]) -> float:
    """Median over iterations of the slowest rank's time."""
    return statistics.median(max(r["seconds"][i] for r in ranks) for i in range(len(ranks[0]["seconds"])))


def run_tenants(rack, point: dict, log, time_limit: float = 300.0) -> List[dict]:
    """The multitenant point on `rack` (up): per repeat, job 1 alone, then both jobs at once.
    One runner-style row per job and run, with `variant` alone | shared, `job` and `share`."""
    cluster = rack.cluster
    if cluster.hierarchical or len(cluster.workers) % 2:
        raise PHubError("the multitenant point needs one rack with an even number of workers")
    scale = cluster.extra["scale"]
    params = {"model": point["model"], "scale": scale, "compute": "zero", "variant": "full",
              "iterations": point["iterations"], "warmup": point["warmup"], "verify": True,
              "worker_class": WORKER_CLASS}
    half, nics = len(cluster.workers) // 2, len(cluster.servers[0].addresses)
    share = max(1.0, len(cluster.workers) / nics)
    nbytes = scaled(load_model(point["model"]), scale).bytes
    rates = cluster.extra.get("configured_mbit", {})
    rows = []
    for repeat in range(point["repeats"]):
        for variant, jobs in (("alone", (1,)), ("shared", (1, 2))):
            with tempfile.TemporaryDirectory(prefix="phub-tenants-") as out:
                clock = os.path.join(out, "monitor.clock")
                with Monitor(clock_file=clock) as monitor:
                    results = run_jobs(cluster, jobs, dict(params, monitor_clock=clock), out, time_limit)
            everyone = [r for job in jobs for r in results[job]]
            figures = summarize(monitor.samples, block(everyone, 0, point["iterations"]), os.cpu_count() or 1,
                                rates.get("host"), rates.get("pbox_nic"))
            for job in jobs:
                seconds = seconds_per_iteration(results[job])
                rows.append({"workers": half, "job": job, "share": share if variant == "shared" else 1.0,
                             "variant": variant, "repeat": repeat, "bytes_per_worker": nbytes,
                             "seconds_per_iteration": seconds, "verified": True, "verify_kind": "oracle",
                             "cluster": dict(cluster.extra),
                             "bound": settle(figures, seconds, None, point["iterations"])})
            print(f"multitenant: repeat {repeat} {variant}: "
                  + ", ".join(f"job {j} {rows[-len(jobs) + i]['seconds_per_iteration'] * 1e3:.1f} ms"
                              for i, j in enumerate(jobs)), file=log, flush=True)
    return rows
