"""Run one exchange benchmark of any system and return its result row (`python -m experiments bench exchange`).

The runner builds the run's cluster (`experiments.network`), has the system start its processes
on it with `python -m experiments.worker` on every worker node, and turns the ranks' timings into
one row, the same for every system:

system, model, workers, bytes_per_worker, iterations, warmup, seconds_per_iteration (median over
the timed iterations of the slowest rank's time), seconds_per_iteration_all, exchanges_per_s (of
the whole job: `exchanges_per_s`),
samples_per_s (workers x batch per GPU / seconds; null for synthetic layouts), batch_per_gpu,
compute, compute_seconds_per_iteration, compute_provenance, verified, verify_max_error, verify_kind
("oracle", or "workers_agree" with real compute; null without --verify), network,
cluster (the cluster's `extra`: link rates etc., empty on loopback), the system's own settings
(servers, interfaces, cores, ...), gbit_per_s_per_worker, host, python, and bound (what limited
the run: cpu_busy, cpu_steal, busiest_process, busiest_process_cpu, link_utilization, its floors
(compute_floor_seconds, wire_floor_seconds, floor_seconds, over_floor) and bound = compute | wire |
cpu | other; see experiments.monitor; {} when the samples missed the timed iterations), and windows
(each rank's [start, end] of the block on CLOCK_MONOTONIC, null where a rank reported no stamps).

With `--compute real` (experiments.realcompute) the bytes, batch and compute seconds are the real
network's (measured by the workers), and the row adds zoo_model, image_size, device and
loss_per_iteration.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

from phub.reduction.chunking import DEFAULT_CHUNK_BYTES
from phub.launching.cluster import Cluster
from phub.errors import ConfigError, PHubError

from . import realcompute
from .models import compute_schedule, load_model, scaled
from .monitor import Monitor, block, settle, summarize
from .network import cluster_for
from .systems import get_system
from .worker import ENV_PARAMS

VARIANTS = ("full", "no_optimizer", "no_compute")
QUIET_TAIL_LINES = 25  # lines of the processes' output a quiet run's failure message ends with
_ROOT = str(Path(__file__).resolve().parent.parent)  # so `-m experiments.worker` imports anywhere


def worker_pythonpath() -> str:
    """PYTHONPATH for a worker process: the harness's folder first, then this process's own."""
    return os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)


@dataclass(frozen=True)
class Options:
    compute: str = "zero"  # zero | replay | real
    network: str = "loopback"  # a key of experiments.network.NETWORKS
    spec: Optional[str] = None  # the network's description file (emulated rack)
    cores: int = 1  # phub: server processes per server node
    num_interfaces: int = 1  # phub: each PBox's interfaces
    racks: int = 1  # phub on loopback: one PBox per rack (two-phase reduction)
    simulated_racks: int = 1  # phub: one PBox stands in for this many racks, as the paper measured (R trips per chunk)
    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # phub / pshard
    lanes_per_pair: int = 1  # phub / pshard
    transport: str = "tcp"  # phub / pshard: tcp | verbs | soft-verbs
    bigarray_bound: int = 1000 * 1000  # pslite: MXNet's big-array bound at the paper's scale (see systems.pslite)
    time_limit: float = 300.0  # seconds the whole run may take; no wait inside it is longer
    variant: str = "full"  # breakdown experiment: full | no_optimizer | no_compute (compute removed)
    image_size: Optional[int] = None  # real compute: square image side (None: full on a GPU, smallest on a CPU)
    batch: Optional[int] = None  # real compute: samples per worker (None: the profile's on a GPU, 4 on a CPU)


def exchanges_per_s(workers: int, seconds_per_iteration: float) -> float:
    """The job's whole-model exchanges per second: every worker completes one exchange (pushes its
    gradients, receives the new weights) per iteration. The one definition of the figure."""
    return workers / seconds_per_iteration


def run_exchange(system: str, model: str, workers: int, iterations: int, warmup: int = 1,
                 verify: bool = False, options: Options = Options(), quiet: bool = False) -> dict:
    """Run the benchmark; return its row. Blocks for the whole run. Raises ConfigError for bad
    arguments (before starting anything) and PHubError naming the process that failed. `quiet`
    keeps the processes' output off stderr; a failure's message then ends with its last lines."""
    return run_exchanges(system, model, workers, iterations, warmup, verify, options, quiet)[0]


def run_exchanges(system: str, model: str, workers: int, iterations: int, warmup: int = 1,
                  verify: bool = False, options: Options = Options(), quiet: bool = False, repeats: int = 1,
                  on_row: Optional[Callable[[dict], None]] = None, cluster: Optional[Cluster] = None) -> List[dict]:
    """`run_exchange` with `repeats` blocks of `iterations` timed iterations, one row per block.

    Warm-up rule: the processes start once; the first `warmup` iterations (and the one after
    them, which still finishes the last warm-up exchange) are dropped, then `repeats` consecutive
    blocks are timed, so a repeat costs no process start. `cluster`: run on this cluster (already
    up, e.g. an emulated rack shared by several points) instead of building one from `options`.
    `on_row` is called with each row when the run is done."""
    if iterations < 1 or warmup < 0 or workers < 1 or repeats < 1:
        raise ConfigError("iterations must be >= 1, warmup >= 0, workers >= 1 and repeats >= 1")
    if options.variant not in VARIANTS:
        raise ConfigError(f"--variant {options.variant}: choose one of {', '.join(VARIANTS)}")
    if options.variant == "no_compute" and options.compute != "zero":
        raise ConfigError("--variant no_compute removes compute: use it with --compute zero")
    if options.variant == "no_optimizer" and verify:
        raise ConfigError("--variant no_optimizer runs no optimizer: there is nothing to --verify")
    if options.simulated_racks > 1 and (system != "phub" or options.racks > 1 or verify):
        raise ConfigError("--simulate-racks runs phub's one-PBox rack simulation: --system phub, one rack, no "
                          "--verify (the sums it makes are R x the workers', not the exchange's oracle)")
    if options.transport == "soft-verbs" and options.network != "loopback":
        raise ConfigError("--transport soft-verbs reaches only the processes of one network namespace: "
                          "use it with --network loopback")
    sut = get_system(system)
    loaded = load_model(model)
    if options.compute == "real":
        if options.network == "emulated":
            raise ConfigError("--compute real trains the real network, which an emulated rack cannot scale "
                              "down with its links: use --network loopback or a real cluster")
        realcompute.check_config(model, options.image_size, options.batch, options.variant)
    else:
        if options.image_size is not None or options.batch is not None:
            raise ConfigError("--image-size and --batch size the real network's input: use them with --compute real")
        compute_schedule(loaded, options.compute)  # rejects replay without a profile, before starting
    output = tempfile.TemporaryFile("w+", errors="replace") if quiet else sys.stderr
    rows: List[dict] = []
    try:
        with contextlib.ExitStack() as stack:
            if cluster is None:
                cluster = stack.enter_context(_entered(cluster_for(system, workers, options)))
            rows = _launch(sut, model, loaded, workers, iterations, warmup, verify, options, cluster, output, repeats)
    except PHubError as exc:
        if not quiet:
            raise
        output.seek(0)
        tail = "".join(output.readlines()[-QUIET_TAIL_LINES:])
        raise PHubError(f"{exc}\n--- last output of the run ---\n{tail}") from None
    finally:
        if quiet:
            output.close()
    for row in rows:
        if on_row is not None:
            on_row(row)
    return rows


@contextlib.contextmanager
def _entered(made):
    """A network function's result as a context manager (it may return a Cluster or one)."""
    if isinstance(made, Cluster):
        yield made
    else:
        with made as cluster:
            yield cluster


def _launch(sut, model, loaded, workers, iterations, warmup, verify, options, cluster, output, repeats) -> List[dict]:
    """One start of the system's processes; one row per block of `iterations`."""
    scale = cluster.extra.get("scale")  # an emulated rack scales bytes and compute time
    with tempfile.TemporaryDirectory(prefix="phub-exchange-") as out_dir:
        params = {"model": model, "scale": scale, "compute": options.compute, "variant": options.variant,
                  "iterations": iterations * repeats, "warmup": warmup, "verify": verify,
                  "worker_class": sut.worker_class, "out_dir": out_dir,
                  "image_size": options.image_size, "batch": options.batch,
                  "monitor_clock": os.path.join(out_dir, "monitor.clock")}
        env = {ENV_PARAMS: json.dumps(params), "PYTHONPATH": worker_pythonpath()}
        with Monitor(clock_file=params["monitor_clock"], switch_ns=cluster.extra.get("switch_ns")) as monitor:
            sut.launch(cluster, [sys.executable, "-m", "experiments.worker"], env, options, output)
        ranks = []
        for rank in range(workers):
            try:
                with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                    ranks.append(json.load(f))
            except FileNotFoundError:
                raise PHubError(f"{sut.name}: rank {rank} finished without writing its result") from None
        real = realcompute.row_fields(ranks, out_dir, verify) if options.compute == "real" else None
    rates = cluster.extra.get("configured_mbit", {})
    rows = []
    for b in range(repeats):
        first = b * iterations
        part = [dict(r, seconds=r["seconds"][first:first + iterations]) for r in ranks]
        row = _row(sut, scaled(loaded, scale), workers, iterations, warmup, verify, options, cluster, part, real)
        row["repeat"] = b
        row["windows"] = [view["window"] for view in block(ranks, first, iterations)]
        figures = summarize(monitor.samples, block(ranks, first, iterations), os.cpu_count() or 1,
                            rates.get("host"), rates.get("pbox_nic"), rates.get("uplink"))
        row["bound"] = settle(figures, row["seconds_per_iteration"], row["compute_seconds_per_iteration"], iterations)
        rows.append(row)
    return rows


def _row(sut, model, workers, iterations, warmup, verify, options, cluster, ranks, real=None) -> dict:
    """The result row; `real`: realcompute.row_fields, which replace the profile's numbers."""
    timed = [max(r["seconds"][i] for r in ranks) for i in range(iterations)]
    median = statistics.median(timed)
    profile = model.profile
    errors = [r["max_error"] for r in ranks if r["max_error"] is not None]
    replay = profile is not None and options.compute == "replay"
    fields = real or {
        "bytes_per_worker": model.bytes, "batch_per_gpu": profile.batch_per_gpu if profile else None,
        "compute_seconds_per_iteration": profile.seconds_per_iteration if replay else 0.0,
        "compute_provenance": profile.provenance if replay else None,
        "verified": bool(verify) and all(r["verified"] for r in ranks),
        "verify_max_error": max(errors) if errors else None, "verify_kind": "oracle" if verify else None,
    }
    nbytes, batch = fields["bytes_per_worker"], fields["batch_per_gpu"]
    return {
        "system": sut.name, "model": model.name, "workers": workers, "bytes_per_worker": nbytes,
        "iterations": iterations, "warmup": warmup, "seconds_per_iteration": median,
        "seconds_per_iteration_all": timed, "exchanges_per_s": exchanges_per_s(workers, median),
        "samples_per_s": workers * batch / median if batch else None, "batch_per_gpu": batch,
        "compute": options.compute, "variant": options.variant, **fields,
        "network": options.network, "cluster": dict(cluster.extra), **sut.describe(cluster, options),
        "gbit_per_s_per_worker": 2 * nbytes * 8 / median / 1e9,
        "host": platform.node(), "python": platform.python_version(),
    }


def summary(row: dict) -> str:
    """One line in words for a row."""
    return (f"{row['system']} {row['model']}: {row['workers']} workers, {row['bytes_per_worker'] / 1e6:.1f} MB each, "
            f"compute {row['compute']}, {row['seconds_per_iteration'] * 1e3:.1f} ms per iteration (median of "
            f"{row['iterations']}), {row['exchanges_per_s']:.2f} exchanges/s, verified={row['verified']}")
