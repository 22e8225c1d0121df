#!/usr/bin/env python3
"""Raw loopback TCP in phub's byte pattern: the bound `data_path.py` and `cpu_by_role.py` hold
phub to, and the ideal server beside it.

Every worker process sends the model's bytes to one receiver process and receives them back (the
receiver echoes what it reads, a thread per worker), large sends, no framing. That pattern runs
in more than one layout, because which one moves bytes fastest depends on the machine, and a
bound phub could beat would bound nothing:

* `python`: the receiver and the workers in Python (`sendall` in a thread beside a `recv_into`
  loop), as phub's own processes are;
* `c`: the same processes and threads in C (`raw_tcp.c`, compiled on first use with the
  system's C compiler; left out, saying why, where there is none);

each with the kernel's own socket buffer sizing and with every socket's buffers fixed at each of
`SOCKET_BUFFERS` (on a machine whose caches are small next to what autotuned buffers hold in
flight, the receiver copies out bytes that went cold: measured on one 2-core VM, the C layout
took 0.20-0.23 s per ResNet-50 exchange with autotuned buffers and 0.105-0.11 with 256-512 KiB).
`best_raw_tcp` runs them all and returns the fastest, naming it.

    python benchmarks/raw_tcp.py [--model resnet50] [--workers 2] [--repeats 3]

prints every layout's median seconds per exchange, and as its last line one JSON object.
"""
import argparse
import atexit
import functools
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from experiments.monitor import Stolen, median_share, stolen_words
from phub.reduction.kernels import for_owned_buffers, get_backend

ECHO_BUFFER = 1 << 20  # the receiver's read size: large, so system calls cost next to nothing
TCP_ITERATIONS = 8  # timed round trips of the whole model per repeat (after one warm-up)
LOOPBACK = "127.0.0.1"
SOCKET_BUFFERS = (0, 256 * 1024, 512 * 1024)  # SO_SNDBUF and SO_RCVBUF of every socket; 0: the kernel's own
C_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw_tcp.c")


def fused_pass(kernels, workers: int):
    """One round's update as a server core runs it (aggregation.JobState.on_push): the first two
    copies summed into the merge buffer, the others added, the last one fused into NAG (2
    workers: NAG reads both copies, no merge buffer). Returns f(weight, mom, merge, copies)."""
    scale, aggregate, nag = kernels.scale, kernels.aggregate, kernels.nag

    def update(w, m, a, copies) -> None:
        merged = copies[0]
        if workers > 2:
            scale(a, merged, copies[1], 1.0)
            for extra in copies[2:-1]:
                aggregate(a, extra, False)
            merged = a
        nag(w, m, merged, copies[-1], 0.05, 0.9, 0.0, 1.0 / workers, -1.0)

    return update



def _echo(listener: socket.socket, workers: int, nbytes: int, iterations: int, results, update: bool) -> None:
    """The receiver: read each worker's bytes and send them straight back, one thread per worker.
    With `update`, an ideal server instead: every read is followed by the fused aggregate+NAG pass
    over what it brought (each thread takes its share of the elements, so one pass per round in
    all, reading the other workers' last reads as their copies) and the updated weights go back.
    It never waits for the other copies and frames nothing: no server can do less per byte.
    Puts its CPU seconds from the end of every connection's first round trip (the warm-up) on."""
    lock, warmed = threading.Lock(), []
    reads = [bytearray(ECHO_BUFFER) for _ in range(workers)]
    copies = [np.frombuffer(b, np.float32) for b in reads]
    weight, mom = np.full(nbytes // 4, 0.01, np.float32), np.zeros(nbytes // 4, np.float32)
    weight_bytes = memoryview(weight).cast("B")
    merge = np.zeros(ECHO_BUFFER // 4, np.float32)
    update_pass = fused_pass(for_owned_buffers(get_backend("fast")), workers)

    def serve(conn: socket.socket, rank: int) -> None:
        buf = memoryview(reads[rank])
        left, received, done = nbytes * iterations, 0, 0  # received, done: of this round's bytes
        while left:
            start = received % ECHO_BUFFER
            n = conn.recv_into(buf[start:], min(len(buf) - start, nbytes - received))
            if not n:
                return
            if not update:
                conn.sendall(buf[start:start + n])
            received += n
            if update and received - done >= 4:  # reads never wrap the buffer, so neither does [done, end)
                end = received - received % 4
                lo, hi = done // 4, end // 4
                mine = slice(lo + (hi - lo) * rank // workers, lo + (hi - lo) * (rank + 1) // workers)
                at = slice(mine.start - lo + (done % ECHO_BUFFER) // 4, mine.stop - lo + (done % ECHO_BUFFER) // 4)
                update_pass(weight[mine], mom[mine], merge[at], [c[at] for c in copies])
                conn.sendall(weight_bytes[done:end])
                done = end
            if left > nbytes * (iterations - 1) >= left - n:  # this connection's warm-up is over
                with lock:
                    warmed.append(time.process_time())
            left -= n
            if received == nbytes:
                received = done = 0

    conns = [listener.accept()[0] for _ in range(workers)]
    threads = [threading.Thread(target=serve, args=(c, rank)) for rank, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(("echo", time.process_time() - max(warmed)))


def _sized(sock: socket.socket, sockbuf: int) -> socket.socket:
    """`sock` with its send and receive buffers fixed at `sockbuf` bytes (0: left to the kernel).
    Set before connecting (a listener's pass to the sockets it accepts), so the window the
    handshake announces fits them."""
    if sockbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
    return sock


def _tcp_worker(port: int, nbytes: int, iterations: int, results, sockbuf: int) -> None:
    sock = _sized(socket.socket(socket.AF_INET, socket.SOCK_STREAM), sockbuf)
    sock.settimeout(120)
    sock.connect((LOOPBACK, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    src = memoryview(np.ones(nbytes // 4, np.float32)).cast("B")
    dst = memoryview(np.empty(nbytes // 4, np.float32)).cast("B")
    seconds, cpu = [], 0.0
    for i in range(iterations):
        if i == 1:  # round 0 warms up (first touch of every page)
            cpu = time.process_time()
        started = time.perf_counter()
        sender = threading.Thread(target=sock.sendall, args=(src,))
        sender.start()
        got = 0
        while got < len(dst):
            n = sock.recv_into(dst[got:])
            if not n:
                raise ConnectionError("the echo receiver closed early")
            got += n
        sender.join()
        seconds.append(time.perf_counter() - started)
    results.put(("worker", seconds, time.process_time() - cpu))


def tcp_seconds_per_exchange(nbytes: int, workers: int, update: bool = False, sockbuf: int = 0) -> dict:
    """Raw TCP, phub's pattern, the `python` layout: `seconds` is the median over round trips of
    the slowest worker's time to send and get back `nbytes`; `cpu` and `echo_cpu` the CPU seconds
    per round trip of all the processes and of the receiver alone (what a server must at least
    spend on sockets), the warm-up round left out. `update`: the receiver is the ideal server
    (see `_echo`). `sockbuf`: every socket's buffer size (see `_sized`)."""
    nbytes -= nbytes % 4
    iterations = TCP_ITERATIONS + 1
    listener = _sized(socket.socket(socket.AF_INET, socket.SOCK_STREAM), sockbuf)
    listener.bind((LOOPBACK, 0))
    listener.listen(workers)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    echo = ctx.Process(target=_echo, args=(listener, workers, nbytes, iterations, results, update), daemon=True)
    echo.start()
    port = listener.getsockname()[1]
    procs = [ctx.Process(target=_tcp_worker, args=(port, nbytes, iterations, results, sockbuf), daemon=True)
             for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=300) for _ in range(workers + 1)]
        per_worker = [report[1] for report in reports if report[0] == "worker"]
        [echo_cpu] = [report[1] for report in reports if report[0] == "echo"]
        cpu = echo_cpu + sum(report[2] for report in reports if report[0] == "worker")
    finally:
        for p in [*procs, echo]:
            p.join(10)
            if p.is_alive():
                p.kill()
        listener.close()
    return _summary(per_worker, cpu, echo_cpu)


def _summary(per_worker, cpu: float, echo_cpu: float) -> dict:
    slowest = [max(w[i] for w in per_worker) for i in range(1, TCP_ITERATIONS + 1)]  # round 0 warms up
    return {"seconds": statistics.median(slowest), "cpu": cpu / TCP_ITERATIONS, "echo_cpu": echo_cpu / TCP_ITERATIONS}


@functools.lru_cache(maxsize=None)
def c_program() -> tuple:
    """(path of the compiled `raw_tcp.c`, '') or (None, why not): built once per process, with
    the first C compiler found (`$CC`, cc, gcc), into a temporary folder removed at exit."""
    compiler = next((c for c in (os.environ.get("CC"), "cc", "gcc") if c and shutil.which(c)), None)
    if compiler is None:
        return None, "no C compiler (cc or gcc) on PATH"
    folder = tempfile.mkdtemp(prefix="raw_tcp-")
    atexit.register(shutil.rmtree, folder, True)
    binary = os.path.join(folder, "raw_tcp")
    built = subprocess.run([compiler, "-O3", "-pthread", "-o", binary, C_SOURCE], capture_output=True, text=True)
    if built.returncode != 0:
        return None, f"{compiler} could not build raw_tcp.c: {built.stderr.strip()[-300:]}"
    return binary, ""


def c_seconds_per_exchange(nbytes: int, workers: int, update: bool = False, sockbuf: int = 0) -> dict:
    """`tcp_seconds_per_exchange` in the `c` layout (raw_tcp.c): the same processes, threads and
    bytes, no interpreter; `update`: its ideal server (`nag_share`). RuntimeError if the program
    fails or there is none (see `c_program`)."""
    binary, why = c_program()
    if binary is None:
        raise RuntimeError(why)
    args = [binary, str(nbytes - nbytes % 4), str(TCP_ITERATIONS + 1), str(workers), str(sockbuf)]
    run = subprocess.run(args + (["update"] if update else []), capture_output=True, text=True, timeout=360)
    if run.returncode != 0:
        raise RuntimeError(f"raw_tcp exited with {run.returncode}: {run.stderr.strip()[-300:]}")
    report = json.loads(run.stdout)
    return _summary(report["seconds"], sum(report["worker_cpu"]) + report["echo_cpu"], report["echo_cpu"])


def congestion_control() -> str:
    """This machine's TCP congestion control, which loopback runs (raw and phub alike) use: it
    moves their figures (measured: docs/data-path-log.md); '' where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip()
    except OSError:
        return ""


def layouts() -> list:
    """The raw layouts `best_raw_tcp` runs, as (kind, sockbuf): both kinds (the C one where it
    can be built) at every one of `SOCKET_BUFFERS`."""
    kinds = ["python"] + (["c"] if c_program()[0] else [])
    return [(kind, sockbuf) for sockbuf in SOCKET_BUFFERS for kind in kinds]


def layout_name(kind: str, sockbuf: int) -> str:
    return f"{kind}-{sockbuf // 1024}k" if sockbuf else kind


def measure(kind: str, nbytes: int, workers: int, update: bool = False, sockbuf: int = 0) -> dict:
    """`tcp_seconds_per_exchange` in layout `kind` (`python` or `c`), and `steal`: the share of
    the cores' time the hypervisor took while it ran (experiments.monitor.Stolen)."""
    run = tcp_seconds_per_exchange if kind == "python" else c_seconds_per_exchange
    with Stolen() as stolen:
        result = run(nbytes, workers, update=update, sockbuf=sockbuf)
    return dict(result, steal=stolen.share)


def best_raw_tcp(nbytes: int, workers: int, update: bool = False) -> dict:
    """Every raw layout once (see `layouts`), in turn: the fastest one's `tcp_seconds_per_exchange`
    dict, with its name (`layout`), kind and socket buffer size (`kind`, `sockbuf`), every
    layout's seconds (`layouts`) and the share of the cores' time the hypervisor took during each
    (`layouts_steal`). With `update`, of the ideal server: the layout fastest at echoing need not
    be the one fastest at serving (a receiver that runs the pass between reads is slower to drain
    small socket buffers)."""
    runs = {}
    for kind, sockbuf in layouts():
        runs[(kind, sockbuf)] = measure(kind, nbytes, workers, update=update, sockbuf=sockbuf)
    (kind, sockbuf), best = min(runs.items(), key=lambda item: item[1]["seconds"])
    return dict(best, layout=layout_name(kind, sockbuf), kind=kind, sockbuf=sockbuf,
                layouts={layout_name(*key): round(run["seconds"], 5) for key, run in runs.items()},
                layouts_steal={layout_name(*key): run["steal"] for key, run in runs.items()})


def main() -> int:
    from experiments.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.workers < 1 or args.repeats < 1:
        parser.error("--workers and --repeats must be at least 1")
    nbytes = load_model(args.model).bytes
    if c_program()[0] is None:
        print(f"raw_tcp: the C layout is left out: {c_program()[1]}", file=sys.stderr)
    seconds, steal = {}, {}
    for repeat in range(args.repeats):
        best = best_raw_tcp(nbytes, args.workers)
        for name, s in best["layouts"].items():
            seconds.setdefault(name, []).append(s)
            steal.setdefault(name, []).append(best["layouts_steal"][name])
        timings = [f"{name} {s * 1e3:.1f} ms{stolen_words(best['layouts_steal'][name])}"
                   for name, s in best["layouts"].items()]
        print(f"repeat {repeat}: " + ", ".join(timings), file=sys.stderr, flush=True)
    medians = {name: round(statistics.median(s), 5) for name, s in seconds.items()}
    print(json.dumps({"benchmark": "raw_tcp", "model": args.model, "workers": args.workers, "repeats": args.repeats,
                      "seconds": medians, "fastest": min(medians, key=medians.get),
                      "steal": {name: median_share(shares) for name, shares in steal.items()},
                      "tcp_congestion_control": congestion_control()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
