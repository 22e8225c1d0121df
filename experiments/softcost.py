"""The software-cost experiment's arithmetic: message counts, roles of threads, kinds of code, rows.

The emulated rack slows the links s_n times but not the CPU, so a system's software cost (the
stock PS's copies, aggregation and optimizer: the paper's case for PHub) nearly vanishes there.
This experiment measures it where one machine can: every system on unshaped loopback, compute
removed, the models at full size (s_m = 1), and the CPU seconds each process and thread spends
per exchange (one iteration of the job: every worker pushes its whole gradient once and gets new
weights). `experiments.softcost_run` runs it; this module is its pure part, tested with made-up
samples:

* `traffic`: the payload bytes and messages each role sends plus receives per exchange, from the
  model's layout and the system's rules (phub's chunks, MXNet's big-array split over ps-lite
  servers, Gloo's ring segments);
* `thread_role`: which role a thread's CPU belongs to (server, worker_io, worker_framework);
* `cpu_by_role`: CPU seconds per role inside a time window, from per-thread CPU samples;
  `busiest_thread_share`: how much of it each process's busiest thread did;
* `category_of` / `breakdown`: the paper's breakdown (copies, aggregation, optimizer,
  synchronization, network stack, the rest) from `perf script` samples, by the code they hit;
* `role_rows` / `breakdown_rows`: the tidy rows (the columns of `COLUMNS`).
"""
from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from .models import Model

EXPERIMENT = "software_cost"
ROLES = ("server", "worker_io", "worker_framework")
CATEGORIES = ("copies", "aggregation", "optimizer", "synchronization", "network_stack", "rest")
# Where the CPU went, per role or per kind of code; in this order in every file.
COLUMNS = ("experiment", "system", "model", "workers", "servers", "cores", "message_setting", "message_bytes",
           "role", "category", "processes", "cpu_seconds_per_exchange", "bytes_per_exchange",
           "messages_per_exchange", "data_messages_per_exchange", "messages_source", "seconds_per_iteration",
           "iterations", "monitor_cpu_seconds_per_exchange", "compute_seconds_per_iteration", "repeat",
           "git_commit", "host", "cpu_model", "cpu_steal", "wait_seconds_per_exchange",
           "machine_cores", "busiest_thread_share")

GLOO_MAX_SEGMENT_BYTES = 1024 * 1024  # gloo's ring allreduce: at most this much per send (kMaxSegmentSize)
# System calls a thread that waits for the network blocks in (x86-64 numbers): poll, select,
# pselect6, ppoll, epoll_wait, epoll_pwait, epoll_pwait2.
POLL_CALLS = frozenset({"7", "23", "270", "271", "232", "281", "441"})


@dataclass(frozen=True)
class Setting:
    """One message-size setting of one system: a label and the runner options it changes."""
    label: str
    chunk_bytes: Optional[int] = None  # phub, pshard
    bigarray_bound: Optional[int] = None  # pslite: MXNET_KVSTORE_BIGARRAY_BOUND, elements


def default_settings(chunk_kb: Sequence[int] = (32, 4),
                     bigarray_bounds: Sequence[int] = (1000 * 1000, 1000)) -> Dict[str, Tuple[Setting, ...]]:
    """Two message sizes per system where it has a knob, so per-byte and per-message costs separate:
    phub and pshard at two chunk sizes; pslite-shard at two big-array bounds (MXNet's 10^6, which the
    paper ran, and a small one that splits most arrays over both servers); pslite-central and gloo
    at their one setting (one server splits nothing; torch does not expose gloo's segment size)."""
    chunks = tuple(Setting(f"chunk{kb}k", chunk_bytes=kb * 1024) for kb in chunk_kb)
    bounds = tuple(Setting(_bound_label(b), bigarray_bound=b) for b in bigarray_bounds)
    return {"phub": chunks, "pshard": chunks, "pslite-shard": bounds,
            "pslite-central": (Setting(_bound_label(bigarray_bounds[0]), bigarray_bound=bigarray_bounds[0]),),
            "gloo-ring": (Setting("segment1m"),)}


def _bound_label(bound: int) -> str:
    return f"bound{bound // 10**6}m" if bound % 10**6 == 0 else (
        f"bound{bound // 1000}k" if bound % 1000 == 0 else f"bound{bound}")


@dataclass(frozen=True)
class Traffic:
    """Per exchange, summed over the role's processes: payload bytes and messages sent plus
    received (data messages: those that carry payload), and the median data message's payload."""
    bytes: int
    messages: int
    data_messages: int
    message_bytes: int


def _parts(model: Model, system: str, workers: int, servers: int, setting: Setting) -> List[int]:
    """Payload bytes of every data message one worker pushes in one exchange (the same sizes come
    back as results)."""
    sizes = [4 * a.elements for a in model.arrays]
    if system in ("phub", "pshard"):
        chunk = max(4, setting.chunk_bytes // 4 * 4)
        return [min(chunk, size - start) for size in sizes for start in range(0, size, chunk)]
    if system.startswith("pslite"):
        # MXNet's kvstore_dist: an array of at least the bound's elements is cut into one part per
        # server (rounded as MXNet rounds), a smaller one goes whole to one server.
        parts = []
        for a in model.arrays:
            if a.elements < setting.bigarray_bound or servers == 1:
                parts.append(4 * a.elements)
            else:
                cuts = [round(a.elements / servers * i) for i in range(servers + 1)]
                parts += [4 * (hi - lo) for lo, hi in zip(cuts, cuts[1:])]
        return parts
    if system == "gloo-ring":
        return gloo_segments(sum(sizes), workers)
    raise ValueError(f"software cost: no message rules for system {system!r}")


def gloo_segments(total_bytes: int, ranks: int, max_segment: int = GLOO_MAX_SEGMENT_BYTES) -> List[int]:
    """The payload of every send one rank makes in gloo's ring allreduce of `total_bytes` (float32):
    the buffer is cut into a multiple of `ranks` segments (at least two per rank, each at most
    `max_segment`), and a rank sends numSegments - numSegments/ranks of them in the reduce-scatter
    and as many in the allgather (segments past the end are empty and not sent)."""
    if ranks < 2:
        return []
    count = max(math.ceil(total_bytes / max_segment), 2 * ranks)
    count = math.ceil(count / ranks) * ranks
    segment = math.ceil(math.ceil(total_bytes / count) / 4) * 4
    per_rank = count // ranks
    sends = []
    for phase_start in (1, 0):  # reduce-scatter starts one rank ahead, allgather at its own
        for i in range(count - per_rank):
            offset = ((phase_start * per_rank + i) * segment) % (count * segment)  # rank 0's view
            length = min(segment, total_bytes - offset)
            if length > 0:
                sends.append(length)
    return sends


def traffic(model: Model, system: str, workers: int, servers: int, setting: Setting) -> Dict[str, Traffic]:
    """What each role sends plus receives per exchange (`Traffic`), from the layout and the
    system's rules. A worker's framework threads handle the same bytes and messages as its I/O
    threads (they copy what is sent and received), so both worker roles carry the workers' totals.

    Rules: phub/pshard send each chunk as one frame and get one frame back (no pull request);
    ps-lite exchanges four messages per part (push with data, its ack, pull request, pull
    response with data); gloo's ring sends and receives `gloo_segments` per rank (no server)."""
    parts = _parts(model, system, workers, servers, setting)
    pushed = sum(parts)
    data = 2 * len(parts)  # every part goes out and comes back with data
    control = 2 * len(parts) if system.startswith("pslite") else 0  # ps-lite's acks and pull requests
    median = int(statistics.median(parts)) if parts else 0
    worker = Traffic(2 * pushed * workers, (data + control) * workers, data * workers, median)
    out = {"worker_io": worker, "worker_framework": worker}
    out["server"] = worker if servers else Traffic(0, 0, 0, median)
    return out


def thread_role(system: str, is_worker: bool, is_main: bool, name: str, blocked: Mapping[str, int]) -> str:
    """The role of one thread's CPU. Every thread of a server or scheduler process is `server`.
    In a worker, the main thread (the caller: the replay, the API calls, their copies) is
    `worker_framework`; of its other threads, the communication library's are `worker_io`:
    phub's client I/O thread (a phub worker's only other busy thread); Gloo's threads (named
    gloo_* and pt_gloo_*: the transport's event loop and the collective's run loop); for MXNet,
    the threads seen waiting in poll-family calls (ZeroMQ's I/O thread, ps-lite's receiving
    thread), while MXNet's engine threads and ps-lite's customer thread wait on futexes and
    count as framework. `blocked`: how often each system call number was seen blocking."""
    if not is_worker:
        return "server"
    if is_main:
        return "worker_framework"
    if system in ("phub", "pshard"):
        return "worker_io"
    if system == "gloo-ring":
        return "worker_io" if name.startswith(("gloo", "pt_gloo")) else "worker_framework"
    waits = Counter({call: n for call, n in blocked.items() if call not in ("running", "")})
    if waits and waits.most_common(1)[0][0] in POLL_CALLS:
        return "worker_io"
    return "worker_framework"


@dataclass
class ThreadTrace:
    """One thread's samples: (time, CPU seconds so far) in time order, what it is, and how often
    each system call was seen (the first field of /proc/PID/task/TID/syscall, or "running")."""
    pid: int
    tid: int
    name: str
    is_worker: bool
    points: List[Tuple[float, float]] = field(default_factory=list)
    blocked: Counter = field(default_factory=Counter)
    # (time, seconds spent ready to run but waiting for a core so far: schedstat's 2nd field)
    waits: List[Tuple[float, float]] = field(default_factory=list)


def cpu_at(points: Sequence[Tuple[float, float]], t: float) -> float:
    """A thread's CPU seconds at time t, linearly interpolated between its samples. Before its
    first sample the thread did not exist yet (0); after its last it had exited (its last value)."""
    if not points or t <= points[0][0]:
        return 0.0 if not points or t < points[0][0] else points[0][1]
    if t >= points[-1][0]:
        return points[-1][1]
    lo, hi = 0, len(points) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if points[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (ta, va), (tb, vb) = points[lo], points[hi]
    return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else vb


def block_window(windows: Sequence[Optional[Sequence[float]]]) -> Tuple[float, float]:
    """The block's window from each rank's [start, end]: the mean start and the mean end. Ranks
    run a steady phase apart (one waits on the other), so the span of all of them is that phase
    longer than the block, and their overlap that much shorter; the mean is as long as the block.
    Raises ValueError when a rank reported none."""
    if not windows or any(w is None for w in windows):
        raise ValueError("a rank reported no window for this block")
    return (statistics.fmean(w[0] for w in windows), statistics.fmean(w[1] for w in windows))


def _busy_in(traces: Iterable[ThreadTrace], system: str,
             window: Tuple[float, float]) -> Iterator[Tuple[ThreadTrace, str, float]]:
    """(trace, its role, its CPU seconds inside `window`) for each thread that used CPU there."""
    start, end = window
    for trace in traces:
        used = cpu_at(trace.points, end) - cpu_at(trace.points, start)
        if used > 0:
            yield trace, thread_role(system, trace.is_worker, trace.pid == trace.tid, trace.name, trace.blocked), used


def cpu_by_role(traces: Iterable[ThreadTrace], system: str,
                window: Tuple[float, float]) -> Dict[str, Tuple[float, int]]:
    """{role: (CPU seconds inside `window`, processes or threads counted)}: servers count their
    processes, worker_io its threads, worker_framework the worker processes. A thread counts
    where it used CPU inside the window."""
    seconds = {role: 0.0 for role in ROLES}
    who: Dict[str, set] = {role: set() for role in ROLES}
    for trace, role, used in _busy_in(traces, system, window):
        seconds[role] += used
        who[role].add(trace.tid if role == "worker_io" else trace.pid)
    return {role: (seconds[role], len(who[role])) for role in ROLES}


def busiest_thread_share(traces: Iterable[ThreadTrace], system: str,
                         window: Tuple[float, float]) -> Dict[str, float]:
    """{role: the CPU of each process's busiest thread of that role inside `window`, summed over
    the processes, over the role's CPU there}: 1 where each process does the role's work on one
    thread, less where its other threads (ZeroMQ's I/O thread, MXNet's engine threads) take a
    share of it beside the busiest; NaN for a role that used no CPU."""
    per_thread: Dict[str, Dict[int, List[float]]] = {role: {} for role in ROLES}
    for trace, role, used in _busy_in(traces, system, window):
        per_thread[role].setdefault(trace.pid, []).append(used)
    out = {}
    for role, processes in per_thread.items():
        total = sum(sum(used) for used in processes.values())
        out[role] = sum(max(used) for used in processes.values()) / total if total > 0 else math.nan
    return out


def wait_by_role(traces: Iterable[ThreadTrace], system: str, window: Tuple[float, float]) -> Dict[str, float]:
    """{role: seconds its threads spent ready to run but waiting for a core inside `window`}
    (the run-queue wait: on a machine with fewer cores than runnable threads, the part of the
    wall time that is neither CPU nor waiting for the network). Threads without wait samples
    (traces made before it was recorded) count nothing."""
    start, end = window
    waited = {role: 0.0 for role in ROLES}
    for trace, role, _ in _busy_in(traces, system, window):
        if not trace.waits:
            continue
        waited[role] += max(0.0, cpu_at(trace.waits, end) - cpu_at(trace.waits, start))
    return waited


# Kinds of code, first match wins: (category, dso pattern, symbol pattern). `kernel` is the
# kernel's code. Its futex and scheduler paths are waiting on locks and condition variables; its
# memory management (page faults, zeroing and freeing pages, and the page lists' locks, where
# `_raw_spin_unlock_irq*` samples come from, as call graphs show) is the rest; everything else it
# runs for these processes is the socket path over loopback: the network stack. phub's core adds
# the last worker's copy and runs the optimizer in one pass (finish_round_of): optimizer; its
# first copies are libc's memmove: copies.
_RULES = [
    ("synchronization", r"kernel", r"^(__x64_sys_futex|futex|__futex|schedule$|__schedule|schedule_timeout"
                                   r"|finish_task_switch|pick_next_task|try_to_wake_up|ttwu_|do_nanosleep)"),
    ("rest", r"kernel", r"page_fault|clear_page|anonymous_page|mm_fault|folio|memcg|freelist|alloc_pages"
                        r"|alloc_frozen|free_pages|free_frozen|free_unref|rmqueue|unmap|zap_|lru|mmap"
                        r"|_raw_spin_unlock_irq"),
    ("network_stack", r"kernel", r""),
    ("optimizer", r"mxnet", r"NAG|nag_mom|SGDMom|sgd_mom|Optimizer|Updater|mp_nag"),
    ("aggregation", r"mxnet", r"Plus|plus|ElementwiseSum|elemwise_add|ReduceSum|Accumulate"),
    ("copies", r"mxnet", r"Copy|copy|memcpy"),
    ("network_stack", r"mxnet", r"zmq::|ps::|ZMQVan|protobuf|PBMeta"),
    ("synchronization", r"mxnet", r"engine::|Engine|ThreadedVar|OprBlock|ThreadPool|ConcurrentBlockingQueue"
                                  r"|ThreadsafePQueue|condition_variable|mutex"),
    ("optimizer", r"_fastpath|_fastkernels", r"finish_|nag|sgd|optim"),
    ("aggregation", r"_fastpath|_fastkernels", r"fold|add|sum|accumulate"),
    ("network_stack", r"_fastpath", r""),  # the C loops' framing, receive and send calls
    ("copies", r"libc", r"memmove|memcpy|memset"),
    ("synchronization", r"libc|libpthread", r"pthread_(mutex|cond|spin|rwlock)|__lll_lock|futex|sem_"),
    ("network_stack", r"libzmq|libprotobuf", r""),
]
_COMPILED = [(category, re.compile(dso), re.compile(symbol)) for category, dso, symbol in _RULES]


def category_of(symbol: str, dso: str) -> str:
    """The breakdown category of one perf sample (`symbol` in `dso`, as `perf script` names them)."""
    base = dso.rsplit("/", 1)[-1]
    for category, dso_pattern, symbol_pattern in _COMPILED:
        if dso_pattern.search(base) and symbol_pattern.search(symbol):
            return category
    return "rest"


_SAMPLE = re.compile(r"\s*(\d+)/(\d+)\s+([\d.]+):\s+\S+\s+(.*?)\s+\((.*)\)\s*$")  # pid/tid time: ip symbol (dso)


def breakdown(lines: Iterable[str], pids: Iterable[int], window: Tuple[float, float],
              seconds_per_sample: float) -> Dict[str, float]:
    """CPU seconds by category inside `window` of the processes `pids`, from the lines of
    `perf script -F pid,tid,time,ip,sym,dso` of a recording that took one sample every
    `seconds_per_sample` of CPU (cpu-clock at a fixed period) on the window's clock."""
    wanted = set(pids)
    start, end = window
    counts = Counter({category: 0 for category in CATEGORIES})
    for line in lines:
        match = _SAMPLE.match(line)
        if not match:
            continue
        pid, _, t, symbol, dso = match.groups()
        if int(pid) in wanted and start <= float(t) <= end:
            counts[category_of(symbol, dso)] += 1
    return {category: counts[category] * seconds_per_sample for category in CATEGORIES}


@dataclass(frozen=True)
class Block:
    """One timed block of a run: what the runner's row says of it, and its window on the clock."""
    repeat: int
    iterations: int
    seconds_per_iteration: float
    window: Tuple[float, float]
    monitor_cpu_seconds: Optional[float]  # the runner's monitor: every process's CPU in its window
    cpu_steal: Optional[float]


def _common(run: Mapping, block: Block) -> dict:
    return {"experiment": EXPERIMENT, "system": run["system"], "model": run["model"], "workers": run["workers"],
            "servers": run["servers"], "cores": run.get("cores", ""), "message_setting": run["message_setting"],
            "seconds_per_iteration": block.seconds_per_iteration, "iterations": block.iterations,
            "monitor_cpu_seconds_per_exchange": _per(block.monitor_cpu_seconds, block.iterations),
            "compute_seconds_per_iteration": run["compute_seconds_per_iteration"], "repeat": block.repeat,
            "git_commit": run["git_commit"], "host": run["host"], "cpu_model": run["cpu_model"],
            "cpu_steal": "" if block.cpu_steal is None else block.cpu_steal, "wait_seconds_per_exchange": "",
            "busiest_thread_share": "",
            # the machine's cores (every process of the run shares them), not the workers' count
            "machine_cores": run.get("machine_cores", "")}


def _per(seconds: Optional[float], iterations: int):
    return "" if seconds is None else round(seconds / iterations, 6)


def role_rows(run: Mapping, block: Block, by_role: Mapping[str, Tuple[float, int]],
              flows: Mapping[str, Traffic], waits: Optional[Mapping[str, float]] = None,
              shares: Optional[Mapping[str, float]] = None) -> List[dict]:
    """The block's three role rows (`COLUMNS`). `run`: system, model, workers, servers, cores,
    message_setting, compute_seconds_per_iteration, git_commit, host, cpu_model (machine_cores if
    known). `waits`: each role's run-queue wait in the block (`wait_by_role`); `shares`: its
    busiest threads' share of its CPU (`busiest_thread_share`); without them the columns stay empty."""
    rows = []
    for role in ROLES:
        seconds, count = by_role[role]
        flow = flows[role]
        wait = "" if waits is None else round(waits[role] / block.iterations, 6)
        share = shares.get(role, math.nan) if shares is not None else math.nan
        rows.append(dict(_common(run, block), role=role, category="", processes=count,
                         cpu_seconds_per_exchange=round(seconds / block.iterations, 6),
                         wait_seconds_per_exchange=wait,
                         busiest_thread_share="" if math.isnan(share) else round(share, 4),
                         message_bytes=flow.message_bytes, bytes_per_exchange=flow.bytes,
                         messages_per_exchange=flow.messages, data_messages_per_exchange=flow.data_messages,
                         messages_source="layout"))
    return rows


def breakdown_rows(run: Mapping, block: Block, by_category: Mapping[str, float], processes: int,
                   flows: Mapping[str, Traffic]) -> List[dict]:
    """The block's breakdown rows (role "breakdown", one per category), every process of the run
    together; bytes and messages are the servers' and workers' together."""
    everyone = [flows["server"], flows["worker_io"]]
    return [dict(_common(run, block), role="breakdown", category=category, processes=processes,
                 cpu_seconds_per_exchange=round(by_category[category] / block.iterations, 6),
                 message_bytes=flows["worker_io"].message_bytes, bytes_per_exchange=sum(f.bytes for f in everyone),
                 messages_per_exchange=sum(f.messages for f in everyone),
                 data_messages_per_exchange=sum(f.data_messages for f in everyone), messages_source="layout")
            for category in CATEGORIES]


def iterations_for(model: Model, block_bytes: float, least: int = 1) -> int:
    """Timed iterations per block: enough that a worker moves at least `block_bytes` in it, so that
    the window is long against the sampling period (at least `least`)."""
    return max(least, math.ceil(block_bytes / model.bytes))
