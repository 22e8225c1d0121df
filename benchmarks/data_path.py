#!/usr/bin/env python3
"""How close phub's data path gets to the machine's limits, on loopback, in one run.

    python benchmarks/data_path.py [--model resnet50] [--workers 2] [--repeats 3] [--cores N]
        [--chunk-sizes 1024,4096,32768] [--rate-chunks 4096] [--out FILE]

Three limits, each measured here rather than assumed:

* **Raw TCP** (`tcp_bound_gbps`): the same process layout and byte pattern as a phub exchange,
  with nothing but sockets: every worker process sends the model's bytes to one receiver process
  and receives them back (the receiver echoes what it reads, a thread per worker, so it uses as
  many cores as it can), large sends, no framing. It runs in several layouts (Python and C, the
  kernel's socket buffer sizing and fixed sizes; `raw_tcp.py` says why) and the fastest is the
  bound (`tcp_fastest_layout`; every layout's seconds in `tcp_layouts_seconds`): on some
  machines a layout phub's processes do not share is twice as fast as another. Both sides run
  the machine's TCP congestion control (`tcp_congestion_control`), which moves both.
  `ratio_phub_over_tcp_bound` is phub's effective throughput (the same bytes: up and down, every
  worker) over it: 1.0 would be phub moving gradients as fast as bare TCP moves bytes. phub's
  server runs `--cores` processes, by default one per worker: the receiver's threads run on as
  many cores, so that is the layout raw TCP is measured with (PHub, too, spreads its chunks over
  all of a server's cores). With more than one, the same run also times phub on one server core
  (`ratio_phub_one_core_over_tcp_bound`, `seconds.phub_one_core`), side by side.
* **ps-lite** (`ratio_phub_over_pslite-central`): phub's time per exchange over MXNet's ps-lite
  with one server (it moves the same bytes as phub), same model, same run (below 1: phub faster).
* **One server core** (`chunks_per_s_per_core`): a phub server with one core and two workers
  pushing a synthetic model of `--rate-chunks` chunks of 1 KB, 4 KB and 32 KB, compute removed. The rate
  is pushes the server took in, per second of that core's CPU time (the workers share this
  machine's cores, so wall time would measure them too; `wall_chunks_per_s` says it anyway).
  `kernel_bound_chunks_per_s` is the rate the aggregate+NAG pass alone would allow, run as a
  server core runs it (each round of a chunk reads every worker's copy, the weights and the
  momentum, and writes the last two; with 2 workers in one fused pass), and
  `overhead_us_per_chunk` the server's CPU time per pushed chunk beyond that pass.

And what TCP itself leaves of those goals, from the same raw TCP runs' CPU time (each process
counts its own, the warm-up round left out):

* `socket_us_per_chunk`: the echo receiver's CPU time per byte it took in and sent back, times
  the chunk: what a server core must spend on its sockets per push on TCP, whatever it does;
  `tcp_ceiling_ratio_to_kernel_bound` the share of the kernel bound a core would reach if that
  and the kernel pass were all it spent.
* `ideal_server_ratio_over_tcp_bound`: the raw layouts run again with their receiver turned
  into an ideal server (`raw_tcp.c` has one, as the Python layout does), the fastest of them
  (`ideal_server_layout`; until 2026-12-06 only the layout fastest at echoing, which with small
  socket buffers served slower than phub did): after every read it
  runs the fused aggregate+NAG pass over the bytes the read brought (its share of them: one pass
  per round in all) and sends back the updated weights, in the echo's large reads and sends,
  with no framing, no bookkeeping and no waiting for the other workers' copies. No server that
  aggregates and optimizes can do less per byte, so this is about the most any implementation of
  phub's job can reach on this machine (`seconds.ideal_server`, and its CPU time per exchange in
  `ideal_server_cpu_s_per_exchange` and, for the receiver alone,
  `ideal_receiver_cpu_s_per_exchange`).

And the CPU budget of the raw TCP goal (`budget_at_goal`), all from this run: an exchange 0.8 as
fast as raw TCP, with the cores as busy as raw TCP keeps them, has `cpu_s` of CPU time; raw TCP's
own processes spend `sockets_s` moving the same bytes, and the fused pass over the model at the
exchange's chunk size takes `kernel_s` (what `kernel_bound_chunks_per_s` measures, times the
chunks of one exchange). What is left (`left_s`, and `left_us_per_frame` over the exchange's
pushes and results) is all a server and its workers may spend on everything else: framing,
keeping each round's first copies until the last arrives (`hold_s`: that copy alone, from a
read buffer into the slots, chunk by chunk, at most). `phub_cpu_s` is what
phub's exchange spent in all (the CPU of its server's and workers' processes, in cores, times
the exchange's time; until 2026-12-06 the whole machine's busy share, which also held the
harness and the time the hypervisor took) and `phub_beyond_us_per_frame` its part beyond
sockets and pass, per frame.

Every figure is the median over `--repeats` blocks. Each block runs the compared systems in
turn, so a slow drift of the machine hits all alike; `ratios_by_repeat` gives the main ratios of
each block by itself (phub and the ideal server over raw TCP, phub over the ideal server), whose
spread says how far one run of the benchmark can be trusted on this machine. On a virtual
machine the hypervisor may give its cores to other guests at any time, which no repeat order
cancels: `steal_share` says, for each system, the median share of all cores' time the hypervisor
took while it was measured (/proc/stat's steal; `experiments.monitor`), each line of progress
names it where it reached 5%, and the summary warns when a median did. The last line of stdout
is one JSON object with the keys above; `--out FILE` also writes it there (atomically).
"""
import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time

import numpy as np

from experiments.models import chunks_per_worker, load_model
from experiments.monitor import STOLEN, Stolen, median_share, stolen_words
from experiments.runner import Options, run_exchanges
from experiments.fileio import write_json
from phub.reduction.kernels import for_owned_buffers, get_backend
from phub.network.links import STAGING_BYTES
from raw_tcp import LOOPBACK, best_raw_tcp, c_program, congestion_control, fused_pass

RATE_ITERATIONS = 10  # timed exchanges of a chunk-rate run (CPU time is counted in 10 ms ticks)
GOAL_RATIO = 0.8  # the goal for phub's throughput over raw TCP's


def _median_seconds(one_pass) -> float:
    """The median of 5 timed calls of `one_pass`, after one untimed (first touch of its memory)."""
    one_pass()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# -- one server core -------------------------------------------------------------------------
def kernel_seconds_per_round(chunk_bytes: int, model_bytes: int, workers: int) -> float:
    """The aggregate+NAG pass alone (`fused_pass`), chunk by chunk over a `model_bytes` working
    set, as a server core runs it per round."""
    kernels = for_owned_buffers(get_backend("fast"))  # as a server core calls them: no per-call checks
    n = model_bytes // 4
    step = chunk_bytes // 4
    copies = [np.full(n, 0.001 * (r + 1), np.float32) for r in range(workers)]
    weight, mom, acc = (np.full(n, 0.01, np.float32) for _ in range(3))

    # per chunk: weight, momentum, merge buffer and the copies, sliced before the clock starts (a
    # server core keeps these views too)
    views = [(weight[c], mom[c], acc[c], [copy[c] for copy in copies])
             for c in (slice(lo, lo + step) for lo in range(0, n, step))]
    update = fused_pass(kernels, workers)

    def one_pass() -> None:
        for w, m, a, chunk_copies in views:
            update(w, m, a, chunk_copies)

    return _median_seconds(one_pass) / (n // step)


def _cpu_seconds(pids) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / os.sysconf("SC_CLK_TCK")


def _rate_worker(address: str, rank: int, workers: int, elements: int, iterations: int, barrier) -> None:
    import phub

    with phub.connect(address, rank, workers, timeout=120) as kv:
        weights = np.zeros(elements, np.float32)
        kv.init(0, weights)
        kv.set_optimizer(phub.NAG(learning_rate=0.05, momentum=0.9, rescale_grad=1.0 / workers))
        grad = np.full(elements, 0.001 * (rank + 1), np.float32)
        for _ in range(2):  # warm-up: first-touch of every buffer
            kv.pushpull(0, grad, weights)
        barrier.wait(120)
        for _ in range(iterations):
            kv.pushpull(0, grad, weights)
        barrier.wait(120)


def core_rate(chunk_bytes: int, chunks: int, workers: int) -> dict:
    """One server core's pushes per second of its own CPU time (and per wall second), compute removed."""
    from phub.config import JobSpec, ServerConfig
    from phub.server.processes import Server

    server = Server(ServerConfig(jobs=(JobSpec(num_workers=workers),), interfaces=(LOOPBACK,),
                                 chunk_bytes=chunk_bytes, once=True, timeout=120)).start()
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(workers + 1)
    procs = [ctx.Process(target=_rate_worker, daemon=True,
                         args=(server.address, r, workers, chunk_bytes // 4 * chunks, RATE_ITERATIONS, barrier))
             for r in range(workers)]
    try:
        for p in procs:
            p.start()
        barrier.wait(120)
        cpu, wall = _cpu_seconds(server.pids), time.perf_counter()
        barrier.wait(300)
        cpu, wall = _cpu_seconds(server.pids) - cpu, time.perf_counter() - wall
        for p in procs:
            p.join(60)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a chunk-rate worker failed (exit codes {[p.exitcode for p in procs]})")
        server.wait(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        server.stop()
    pushes = workers * chunks * RATE_ITERATIONS
    return {"cpu": pushes / cpu if cpu > 0 else None, "wall": pushes / wall}


def hold_seconds(chunk_bytes: int, model_bytes: int, workers: int) -> float:
    """Keeping a round's earlier copies until its last arrives, as a server core does: every
    worker's copy but one, chunk by chunk, from a read buffer (hot) into its slot (a slot per
    worker and chunk: the model's size per worker). The Python call per chunk is counted too,
    so this is an upper bound of the copies alone."""
    staging = np.ones(STAGING_BYTES // 4, np.float32)
    step, n = chunk_bytes // 4, model_bytes // 4
    slots = [np.zeros(n, np.float32) for _ in range(workers - 1)]
    pairs = [(slot[lo:lo + step], staging[lo % len(staging):lo % len(staging) + step])
             for slot in slots for lo in range(0, n - step + 1, step) if lo % len(staging) + step <= len(staging)]

    def one_pass() -> None:
        for slot, read in pairs:
            np.copyto(slot, read)

    return _median_seconds(one_pass) * (workers - 1) * (n // step) / max(1, len(pairs))


def cpu_budget(cpu_s: float, sockets_s: float, kernel_s: float, hold_s: float, frames: int, phub_cpu_s) -> dict:
    """The CPU an exchange at the goal may spend (`cpu_s`), less what moving its bytes and the
    fused pass take, per frame, and what holding the first copies would take of that; and
    phub's own spend beyond sockets and pass (see the module docstring)."""
    left = cpu_s - sockets_s - kernel_s
    beyond = None if phub_cpu_s is None else phub_cpu_s - sockets_s - kernel_s
    return {"cpu_s": round(cpu_s, 5), "sockets_s": round(sockets_s, 5), "kernel_s": round(kernel_s, 5),
            "left_s": round(left, 5), "frames": frames, "left_us_per_frame": round(left / frames * 1e6, 2),
            "hold_s": round(hold_s, 5), "phub_cpu_s": None if phub_cpu_s is None else round(phub_cpu_s, 5),
            "phub_beyond_us_per_frame": None if beyond is None else round(beyond / frames * 1e6, 2)}


def _print_raw_run(repeat: int, name: str, receiver: str, run: dict) -> None:
    """One progress line for a `best_raw_tcp` run: its time, CPU and every layout's time."""
    print(f"repeat {repeat}: {name:14s} {run['seconds'] * 1e3:8.1f} ms per exchange{stolen_words(run['steal'])} "
          f"({run['cpu'] * 1e3:.0f} ms of CPU, {run['echo_cpu'] * 1e3:.0f} ms of it the {receiver}'s; the fastest of "
          + ", ".join(f"{layout} {seconds * 1e3:.1f}" for layout, seconds in run["layouts"].items()) + ")",
          file=sys.stderr, flush=True)


def one_core(one_core_s, tcp_s: float, pslite_s: float) -> dict:
    """The summary's ratios of phub on one server core, when it ran beside the main layout."""
    if one_core_s is None:
        return {}
    return {"ratio_phub_one_core_over_tcp_bound": round(tcp_s / one_core_s, 3),
            "ratio_phub_one_core_over_pslite-central": round(one_core_s / pslite_s, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5, help="timed exchanges per block (model runs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, help="phub server processes in the exchange (default: one per worker, "
                        "as the raw TCP receiver runs a thread per worker)")
    parser.add_argument("--chunk-sizes", default="1024,4096,32768")
    parser.add_argument("--rate-chunks", type=int, default=4096, help="chunks of the chunk-rate runs' model")
    parser.add_argument("--out", help="also write the summary and every row to this JSON file")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers must be at least 2 (a server core aggregates copies)")
    args.cores = args.workers if args.cores is None else args.cores
    if args.cores < 1:
        parser.error("--cores must be at least 1")
    sizes = [int(s) for s in args.chunk_sizes.split(",") if s]

    started = time.perf_counter()
    model = load_model(args.model)
    model_bytes = model.bytes
    runs = {"phub": Options(cores=args.cores), "pslite-central": Options()}
    if args.cores != 1:
        runs["phub-one-core"] = Options(cores=1)
    rows, tcp, tcp_cpu, echo_cpu, exchange = [], [], [], [], {name: [] for name in runs}
    phub_cpu, exchange_chunk = [], None
    ideal, ideal_cpu, ideal_receiver_cpu, ideal_layouts, layouts = [], [], [], [], {}
    rates = {size: {"wall": [], "cpu": []} for size in sizes}
    steal = {name: [] for name in ("tcp", "ideal_server", *runs, "core_rate")}  # see the module docstring
    for repeat in range(args.repeats):
        bound = best_raw_tcp(model_bytes, args.workers)
        tcp.append(bound["seconds"])
        tcp_cpu.append(bound["cpu"])
        echo_cpu.append(bound["echo_cpu"])
        steal["tcp"].append(bound["steal"])
        for name, seconds in bound["layouts"].items():
            layouts.setdefault(name, []).append(seconds)
        _print_raw_run(repeat, "raw TCP", "receiver", bound)
        best = best_raw_tcp(model_bytes, args.workers, update=True)
        ideal_layouts.append(best["layout"])
        ideal.append(best["seconds"])
        ideal_cpu.append(best["cpu"])
        ideal_receiver_cpu.append(best["echo_cpu"])
        steal["ideal_server"].append(best["steal"])
        _print_raw_run(repeat, "ideal server", "server", best)
        for name, options in runs.items():
            system = name.partition("-one-core")[0]
            row = run_exchanges(system, args.model, args.workers, args.iterations, 1, options=options, quiet=True)[0]
            rows.append(dict(row, repeat=repeat, run=name))
            exchange[name].append(row["seconds_per_iteration"])
            stolen = row["bound"].get("cpu_steal")
            steal[name].append(stolen)
            if name == "phub":
                exchange_chunk = row["chunk_bytes"]
                if row["bound"].get("processes_cpu") is not None:  # phub's processes alone, in cores
                    phub_cpu.append(row["bound"]["processes_cpu"] * row["seconds_per_iteration"])
            print(f"repeat {repeat}: {name:14s} {exchange[name][-1] * 1e3:8.1f} ms per exchange{stolen_words(stolen)}",
                  file=sys.stderr, flush=True)
        for size in sizes:
            with Stolen() as rate_steal:
                rate = core_rate(size, args.rate_chunks, args.workers)
            steal["core_rate"].append(rate_steal.share)
            rows.append({"benchmark": "core_rate", "repeat": repeat, "chunk_bytes": size, **rate,
                         "steal": rate_steal.share})
            for kind in rate:
                if rate[kind] is not None:
                    rates[size][kind].append(rate[kind])
            cpu = f"{rate['cpu']:,.0f}" if rate["cpu"] else "?"
            print(f"repeat {repeat}: one core, {size:5d}-byte chunks: {cpu} pushes per CPU second "
                  f"({rate['wall']:,.0f} per second){stolen_words(rate_steal.share)}", file=sys.stderr, flush=True)

    median = statistics.median
    tcp_s, phub_s, pslite_s = median(tcp), median(exchange["phub"]), median(exchange["pslite-central"])
    one_core_s = median(exchange["phub-one-core"]) if "phub-one-core" in exchange else None
    moved_bits = 2 * args.workers * model_bytes * 8
    # What TCP itself costs a server: the receiver's CPU per byte it took in and sent back.
    socket_s_per_byte = median(echo_cpu) / (args.workers * model_bytes)
    kernels = {size: kernel_seconds_per_round(size, size * args.rate_chunks, args.workers) for size in sizes}
    per_core, per_chunk = {}, {}
    for size in sizes:
        kernel = kernels[size]
        cpu = median(rates[size]["cpu"]) if rates[size]["cpu"] else None
        per_core[str(size)] = round(cpu) if cpu else None
        per_push = {"kernel": kernel / args.workers, "socket": socket_s_per_byte * size}
        per_chunk[str(size)] = {
            "wall_chunks_per_s": round(median(rates[size]["wall"])),
            "kernel_bound_chunks_per_s": round(args.workers / kernel),
            "ratio_to_kernel_bound": round(cpu * kernel / args.workers, 3) if cpu else None,
            "overhead_us_per_chunk": round((1 / cpu - kernel / args.workers) * 1e6, 2) if cpu else None,
            "socket_us_per_chunk": round(per_push["socket"] * 1e6, 2),
            # what a core would reach on TCP if nothing but its sockets and the kernel pass cost
            "tcp_ceiling_ratio_to_kernel_bound": round(per_push["kernel"] / (per_push["kernel"] + per_push["socket"]), 3),
        }
    ideal_s = median(ideal)
    cores_busy = median(tcp_cpu) / tcp_s
    exchange_chunks = chunks_per_worker(model, exchange_chunk)
    budget = cpu_budget(cpu_s=tcp_s / GOAL_RATIO * cores_busy, sockets_s=median(tcp_cpu),
                        kernel_s=kernel_seconds_per_round(exchange_chunk, model_bytes, args.workers) * exchange_chunks,
                        hold_s=hold_seconds(exchange_chunk, model_bytes, args.workers),
                        frames=2 * args.workers * exchange_chunks, phub_cpu_s=median(phub_cpu) if phub_cpu else None)
    summary = {
        "benchmark": "data_path", "model": args.model, "workers": args.workers, "repeats": args.repeats,
        "server_cores": args.cores,
        "tcp_bound_gbps": round(moved_bits / tcp_s / 1e9, 2),
        "tcp_layouts_seconds": {name: round(median(seconds), 5) for name, seconds in layouts.items()},
        "tcp_fastest_layout": min(layouts, key=lambda name: median(layouts[name])),
        "tcp_congestion_control": congestion_control(),
        "phub_gbps": round(moved_bits / phub_s / 1e9, 2),
        "ratio_phub_over_tcp_bound": round(tcp_s / phub_s, 3),
        "tcp_cpu_s_per_exchange": round(median(tcp_cpu), 5), "tcp_cores_busy": round(cores_busy, 2),
        "ideal_server_ratio_over_tcp_bound": round(tcp_s / ideal_s, 3),
        "ideal_server_layout": statistics.mode(ideal_layouts),
        "ideal_server_cpu_s_per_exchange": round(median(ideal_cpu), 5),
        "ideal_receiver_cpu_s_per_exchange": round(median(ideal_receiver_cpu), 5),
        "ratio_phub_over_pslite-central": round(phub_s / pslite_s, 3),
        "ratios_by_repeat": {"phub_over_tcp_bound": [round(t / p, 3) for t, p in zip(tcp, exchange["phub"])],
                             "ideal_server_over_tcp_bound": [round(t / i, 3) for t, i in zip(tcp, ideal)],
                             "phub_over_ideal_server": [round(i / p, 3) for i, p in zip(ideal, exchange["phub"])]},
        "budget_at_goal": budget,
        "seconds": {"tcp": round(tcp_s, 5), "ideal_server": round(ideal_s, 5), "phub": round(phub_s, 5),
                    "pslite-central": round(pslite_s, 5),
                    **({} if one_core_s is None else {"phub_one_core": round(one_core_s, 5)})},
        **one_core(one_core_s, tcp_s, pslite_s),
        "chunks_per_s_per_core": per_core, "per_chunk": per_chunk, "rate_chunks": args.rate_chunks,
        "steal_share": {name: median_share(shares) for name, shares in steal.items()},
        "wall_seconds": round(time.perf_counter() - started, 1), "host": platform.node(), "cpus": os.cpu_count(),
    }
    print(f"\n{args.model}, {args.workers} workers, phub on {args.cores} server core(s), medians of {args.repeats} repeats:")
    if c_program()[0] is None:
        print(f"  (raw TCP's C layout was left out: {c_program()[1]})")
    print(f"  raw TCP {summary['tcp_bound_gbps']} Gbit/s (fastest layout: {summary['tcp_fastest_layout']}), "
          f"phub {summary['phub_gbps']} Gbit/s: {summary['ratio_phub_over_tcp_bound']} of the bound (goal >= {GOAL_RATIO}); raw TCP keeps "
          f"{summary['tcp_cores_busy']} of {os.cpu_count()} cores busy; an ideal server (sockets and the "
          f"fused pass, nothing else) reaches {summary['ideal_server_ratio_over_tcp_bound']}")
    print(f"  at {GOAL_RATIO} of raw TCP an exchange may use {budget['cpu_s'] * 1e3:.0f} ms of CPU: raw TCP's sockets "
          f"take {budget['sockets_s'] * 1e3:.0f}, the fused pass {budget['kernel_s'] * 1e3:.0f}, leaving "
          f"{budget['left_s'] * 1e3:.1f} ms ({budget['left_us_per_frame']} us for each of the {budget['frames']} "
          f"frames); copying each round's first copies into their slots alone takes {budget['hold_s'] * 1e3:.1f} ms; "
          f"phub spends {budget['phub_beyond_us_per_frame']} us per frame beyond sockets and pass")
    print("  the same ratios block by block (each from its own block's runs alone): "
          + "; ".join(f"{name.replace('_', ' ')} {min(values)}-{max(values)}"
                      for name, values in summary["ratios_by_repeat"].items()))
    print(f"  phub / ps-lite (one server): {summary['ratio_phub_over_pslite-central']} (goal <= 0.55)")
    if "ratio_phub_one_core_over_tcp_bound" in summary:
        print(f"  phub on one server core: {summary['ratio_phub_one_core_over_tcp_bound']} of raw TCP, "
              f"{summary['ratio_phub_one_core_over_pslite-central']} of ps-lite's time")
    for size in sizes:
        c = per_chunk[str(size)]
        print(f"  one core, {size:5d} B chunks: {per_core[str(size)]} per CPU s, kernel bound "
              f"{c['kernel_bound_chunks_per_s']} ({c['ratio_to_kernel_bound']} of it; sockets alone allow "
              f"{c['tcp_ceiling_ratio_to_kernel_bound']}), overhead {c['overhead_us_per_chunk']} us per chunk")
    for name, share in summary["steal_share"].items():
        if share is not None and share >= STOLEN:
            print(f"  warning: the hypervisor took {share:.0%} of this machine's CPU time while {name} was measured "
                  "(median): its figures are slower than the machine allows, by an amount its neighbours decide")
    if args.out:
        write_json(args.out, {"summary": summary, "rows": rows}, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
