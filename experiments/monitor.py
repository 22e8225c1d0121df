"""What bounded a run: the machine's cores or the emulated network.

On one machine every process of every node shares its cores, so a point can measure the CPU
instead of the network. While a run's processes work, a `Monitor` thread in the runner samples,
every `PERIOD` seconds, the machine's busy CPU time (/proc/stat), the CPU time of every process
started under the runner (/proc/PID/stat) and the byte counters of every network namespace those
processes live in (/proc/PID/net/dev: a node's own links). After the run, `summarize` cuts the
samples to the timed iterations the workers report (their `window`, CLOCK_MONOTONIC, the same
clock in every process: the span in which every worker was timed, or, when that is less than
half of the span in which any was, that one) and works out:

* ``cpu_busy``: the fraction of all cores busy, less the CPU the workers spent on the oracle
  check (outside the timing, but inside the window); time the hypervisor of a virtual machine
  took from it counts as busy (the run could not have it);
* ``cpu_steal``: that time alone, as a fraction of all cores (/proc/stat's steal: the other
  guests of the host ran while this machine's cores wanted to; 0 on bare metal). Timings taken
  while it is high are slower than the machine allows, by an amount that varies from run to run;
* ``busiest_process`` / ``busiest_process_cpu``: the process that used the most CPU, in cores
  (a single-threaded Python process cannot go much past 1.0);
* ``link_utilization``: the busiest link direction of a worker or server node, or of a rack's
  uplink to the core (read from the switch namespace), bytes x 8 / (configured rate x timed
  seconds) (None on loopback, where links have no rate);
* ``service_cpu``: the CPU of the processes that are not workers (servers, schedulers), in cores;
* ``processes_cpu``: the CPU of every process started under the runner, workers included, in
  cores (what the run itself used of ``cpu_busy``, which also counts the harness and the rest
  of the machine);
* ``tcp_retransmits`` / ``tcp_timeouts``: on an emulated network, the TCP segments the run's
  namespaces sent again and the retransmission timeouts they took (/proc/PID/net/snmp and
  netstat), between the samples around the window: a timeout stalls its connection for at least
  200 ms; whether that cost the run time shows against the point's repeats without any
  (`analysis.claims.causes.troubled_runs`);
* ``bound``: what set the run's pace, judged against its *floor* (`floors`: the larger of its
  replayed compute and its busiest link's bytes at the configured rate, per iteration):
  ``compute`` when the run took at most NEAR_FLOOR x its compute floor (the replayed GPU set the
  pace), ``wire`` when its busiest link ran at >= LINK_FULL of its rate, ``cpu`` when the cores
  or one process were saturated (>= CPU_BOUND), and ``other`` for the rest (latency, stalls,
  the protocol: nothing ran full, yet the run was slower than its floor). The first that holds,
  in that order, is the bound (`classify`).

A window's figures interpolate between the samples around its end, so the processes must still
be alive at a sample after it: a Monitor given a `clock_file` writes its latest sample's time
there, and a worker whose timed iterations ended waits (`wait_for_sample`, bounded) until that
time is past its last stamp before it closes its connections and exits.

Sampling and summarizing are apart: `summarize` is a pure function of the samples, tested with
made-up ones.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

PERIOD = 0.2  # seconds between samples: fine enough for windows of a few seconds, ~1% of a core
HOLD_TIMEOUT = 5 * PERIOD  # a worker waits at most this long for a sample past its window
CPU_BOUND = 0.85  # a CPU figure at or above this: the point measured this machine's CPU
LINK_FULL = 0.85  # a link this busy was the bottleneck
NEAR_FLOOR = 1.1  # a run within this factor of its compute floor was paced by the replayed GPU
BOUNDS = ("compute", "wire", "cpu", "other")  # in the order `classify` tests them
FLOOR_COLUMNS = ("compute_floor_seconds", "wire_floor_seconds", "floor_seconds", "over_floor")  # `floors`
STOLEN = 0.05  # cores that lost this share of their time to the hypervisor ran slower than the machine allows
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SWITCH = "switch"  # Sample.links keys of the switch namespace's interfaces: "switch/up0", ...
CLONE_NEWNET = 0x40000000


@dataclass
class Sample:
    t: float  # time.monotonic()
    busy: float  # machine CPU seconds busy so far (all cores)
    procs: Dict[int, Tuple[float, str]] = field(default_factory=dict)  # pid -> (CPU seconds, name)
    links: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # "ns/iface" -> (rx, tx) bytes
    pid_ns: Dict[int, str] = field(default_factory=dict)  # pid -> network namespace id
    tcp: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # namespace -> (retransmits, timeouts)
    steal: Optional[float] = None  # machine CPU seconds the hypervisor took so far (all cores)


def machine_cpu() -> Tuple[float, float]:
    """(busy, stolen): this machine's CPU seconds so far, all cores together. Busy counts user
    through steal (guest time is already in user); stolen is steal alone, the time the
    hypervisor gave this machine's cores to other guests while they wanted to run."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0
    return (sum(fields[:8]) - idle) / TICK, steal / TICK


class Stolen:
    """A context manager: `share` is the fraction of all cores' time the hypervisor took while
    its block ran (see `machine_cpu`), for a measurement that runs outside a Monitor."""

    share: Optional[float] = None

    def __enter__(self) -> "Stolen":
        self._start = (time.monotonic(), machine_cpu()[1])
        return self

    def __exit__(self, *exc) -> None:
        elapsed = time.monotonic() - self._start[0]
        if elapsed > 0:
            self.share = _round((machine_cpu()[1] - self._start[1]) / ((os.cpu_count() or 1) * elapsed))


def _stat(pid: int) -> Optional[Tuple[int, float]]:
    """(parent pid, CPU seconds) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    words = [os.path.basename(a.decode(errors="replace")) for a in argv if a]
    if "-m" in words[:-1]:
        words = words[words.index("-m") + 1:]  # "python -m phub server ...": the module and its command
    return " ".join(words[:2]).replace(",", " ")[:60]


def _net_dev(pid) -> Dict[str, Tuple[int, int]]:
    """(rx, tx) bytes of every interface but lo in the network namespace of `pid` (a number, or
    "thread-self": the calling thread's)."""
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            lines = f.readlines()[2:]
    except OSError:
        return {}
    out = {}
    for line in lines:
        iface, _, counters = line.partition(":")
        values = counters.split()
        if iface.strip() != "lo" and len(values) >= 9:
            out[iface.strip()] = (int(values[0]), int(values[8]))
    return out


def _enter_netns(name: str) -> bool:
    """Move the calling thread, and only it, into network namespace `name` (as `ip netns`
    names it), so that its /proc/thread-self/net files are that namespace's; False where it
    cannot (no such namespace, no privilege)."""
    try:
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    except OSError:
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) == 0
    finally:
        os.close(fd)


def _counters(path: str, prefix: str) -> Dict[str, int]:
    """One table of /proc/PID/net/snmp or netstat: a `prefix` line of names, then one of values."""
    try:
        with open(path) as f:
            rows = [line.split()[1:] for line in f if line.startswith(prefix)]
    except OSError:
        return {}
    if len(rows) < 2:
        return {}
    return {name: int(value) for name, value in zip(rows[0], rows[1]) if value.lstrip("-").isdigit()}


def _tcp_losses(pid: int) -> Optional[Tuple[int, int]]:
    """(segments retransmitted, retransmission timeouts) so far in `pid`'s network namespace."""
    tcp = _counters(f"/proc/{pid}/net/snmp", "Tcp:")
    ext = _counters(f"/proc/{pid}/net/netstat", "TcpExt:")
    if "RetransSegs" not in tcp or "TCPTimeouts" not in ext:
        return None
    return tcp["RetransSegs"], ext["TCPTimeouts"]


def _descendants(root: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat:
                children.setdefault(stat[0], []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def median_share(shares) -> Optional[float]:
    """The median of the shares that were measured (None where none was)."""
    known = [share for share in shares if share is not None]
    return round(statistics.median(known), 4) if known else None


def stolen_words(share: Optional[float]) -> str:
    """' (the hypervisor took N%)' after a timing, when it took STOLEN or more of the cores'
    time meanwhile: that timing is slower than the machine allows."""
    return f" (the hypervisor took {share:.0%})" if share is not None and share >= STOLEN else ""


def take_sample(root: int, names: Dict[int, str]) -> Sample:
    """One sample of the machine and of every process below `root` (names cached in `names`)."""
    busy, stolen = machine_cpu()
    sample = Sample(time.monotonic(), busy, steal=stolen)
    seen_ns: Dict[str, int] = {}
    for pid in _descendants(root):
        stat = _stat(pid)
        if stat is None:
            continue
        if pid not in names:
            names[pid] = _name(pid)
        sample.procs[pid] = (stat[1], names[pid])
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        sample.pid_ns[pid] = ns
        if ns not in seen_ns:
            seen_ns[ns] = pid
            for iface, counters in _net_dev(pid).items():
                sample.links[f"{ns}/{iface}"] = counters
            losses = _tcp_losses(pid)
            if losses is not None:
                sample.tcp[ns] = losses
    return sample


class Monitor:
    """Samples in a background thread from `start()` to `stop()`; `samples` holds them. With
    `clock_file`, each sample's time is written there (atomically) for `wait_for_sample`."""

    def __init__(self, root: Optional[int] = None, period: float = PERIOD, clock_file: Optional[str] = None,
                 switch_ns: Optional[str] = None):
        self.root = os.getpid() if root is None else root
        self.period = period
        self.clock_file = clock_file
        # the emulated rack's switch namespace, whose links (the uplinks to the core) no process
        # of the run lives beside: the sampling thread enters it to read their counters
        self.switch_ns = switch_ns
        self._in_switch = False
        self.samples: List[Sample] = []
        self._names: Dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="phub-monitor", daemon=True)

    def start(self) -> "Monitor":
        self._thread.start()
        return self

    def stop(self) -> List[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        self._in_switch = bool(self.switch_ns) and _enter_netns(self.switch_ns)
        while True:
            try:
                self._sample()
            except OSError:  # /proc raced with an exiting process: the next sample will do
                pass
            if self._stop.wait(self.period):
                self._sample()
                return

    def _sample(self) -> None:
        sample = take_sample(self.root, self._names)
        if self._in_switch:
            sample.links.update({f"{SWITCH}/{iface}": c for iface, c in _net_dev("thread-self").items()})
        self.samples.append(sample)
        if self.clock_file:
            temporary = f"{self.clock_file}.tmp"
            with open(temporary, "w") as f:
                f.write(repr(self.samples[-1].t))
            os.replace(temporary, self.clock_file)


def wait_for_sample(clock_file: Optional[str], after: float, timeout: float = HOLD_TIMEOUT) -> bool:
    """Block until the Monitor writing `clock_file` has sampled at a time >= `after`
    (CLOCK_MONOTONIC), or `timeout` seconds passed; True if it has. Returns False at once when
    there is no such file (no monitor on this machine: nothing to wait for)."""
    if not clock_file or not os.path.exists(clock_file):
        return False
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(clock_file) as f:
                if float(f.read() or "-inf") >= after:
                    return True
        except (OSError, ValueError):  # replaced under us: read it again
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(PERIOD / 10)


def _at(samples: Sequence[Sample], t: float, value) -> Optional[float]:
    """`value(sample)` linearly interpolated at time t (None where a sample lacks it)."""
    before = [s for s in samples if s.t <= t and value(s) is not None]
    after = [s for s in samples if s.t >= t and value(s) is not None]
    if not before or not after:
        return None
    a, b = before[-1], after[0]
    va, vb = value(a), value(b)
    if b.t == a.t:
        return float(va)
    return va + (vb - va) * (t - a.t) / (b.t - a.t)


def _delta(samples: Sequence[Sample], start: float, end: float, value) -> Optional[float]:
    first, last = _at(samples, start, value), _at(samples, end, value)
    if first is None or last is None:
        return None
    return last - first


def classify(cpu_busy: Optional[float], busiest_cpu: Optional[float], link: Optional[float] = None,
             over_compute: Optional[float] = None) -> str:
    """compute | wire | cpu | other (see the module docstring). `link`: the busiest link's
    utilization (None where links have no rate); `over_compute`: the run's time over its compute
    floor (None without compute)."""
    if over_compute is not None and over_compute <= NEAR_FLOOR:
        return "compute"
    if link is not None and link >= LINK_FULL:
        return "wire"
    if max(x for x in (cpu_busy, busiest_cpu, 0.0) if x is not None) >= CPU_BOUND:
        return "cpu"
    return "other"


def floors(seconds: float, compute_seconds: Optional[float], wire_seconds: Optional[float]) -> dict:
    """A run's floor per iteration: the larger of its replayed compute (`compute_seconds`) and its
    busiest link's bytes at the configured rate (`wire_seconds`), each None when unknown or 0 when
    absent; and the run's `seconds` per iteration over it (`over_floor`, None without a floor)."""
    known = [x for x in (compute_seconds, wire_seconds) if x is not None and x > 0]
    floor = max(known) if known else None
    return {"compute_floor_seconds": _round(compute_seconds, 6), "wire_floor_seconds": _round(wire_seconds, 6),
            "floor_seconds": _round(floor, 6), "over_floor": _round(seconds / floor) if floor else None}


def settle(figures: dict, seconds: float, compute_seconds: Optional[float], iterations: int) -> dict:
    """`summarize`'s figures of one block of `iterations` with the block's floors (`floors`) and its
    bound judged against them; {} stays {}. The busiest link's bytes at its rate are its
    utilization times the timed window, spread over the block's iterations."""
    if not figures:
        return figures
    link, window = figures.get("link_utilization"), figures.get("timed_seconds")
    wire = link * window / iterations if link is not None and window else None
    out = dict(figures, **floors(seconds, compute_seconds, wire))
    over_compute = seconds / compute_seconds if compute_seconds else None
    out["bound"] = classify(figures.get("cpu_busy"), figures.get("busiest_process_cpu"), link, over_compute)
    return out


def block(ranks: Sequence[Mapping], first: int, count: int) -> List[dict]:
    """Each rank's view of its timed iterations first..first+count-1, as `summarize` takes it:
    pid, rank, window (start, end), paused and verify_cpu (its oracle checks' wall and CPU)."""
    views = []
    for r in ranks:
        stamps, checks = r.get("stamps"), r.get("checks")
        if not stamps or checks is None or len(stamps) < first + count + 1:
            views.append({"rank": r.get("rank"), "pid": r.get("pid"), "window": None})
            continue
        inside = checks[first:first + count]
        views.append({"rank": r["rank"], "pid": r.get("pid"), "window": (stamps[first], stamps[first + count]),
                      "paused": sum(c[0] for c in inside), "verify_cpu": sum(c[1] for c in inside)})
    return views


def summarize(samples: Sequence[Sample], ranks: Sequence[Mapping], cores: int,
              host_mbit: Optional[float] = None, server_mbit: Optional[float] = None,
              uplink_mbit: Optional[float] = None) -> dict:
    """The bound figures of one run. `ranks`: each worker's result with `pid`, `window` [start,
    end] of its timed iterations, `paused` (seconds of oracle checks inside it) and `verify_cpu`
    (their CPU seconds). The busiest link is sought among the workers' links (at `host_mbit`),
    the other nodes' (`server_mbit`) and the racks' uplinks to the core (`uplink_mbit`, read in
    the switch namespace). Returns {} when the samples do not cover the window."""
    windows = [r.get("window") for r in ranks]
    if not samples or not windows or any(w is None for w in windows):
        return {}
    paused = max(float(r.get("paused", 0.0)) for r in ranks)
    start, end = max(w[0] for w in windows), min(w[1] for w in windows)
    first, last = min(w[0] for w in windows), max(w[1] for w in windows)
    timed = (end - start) - paused
    if timed < ((last - first) - paused) / 2:
        # Blocks of two iterations of tens of ms, workers some ms apart: the span in which every
        # worker was timed is too short a base for rates (or empty). The span in which any was
        # is the next best, a little wider than the block.
        start, end = first, last
        timed = (end - start) - paused
    if timed <= 0 or samples[0].t > start or samples[-1].t < end:
        return {}
    busy = _delta(samples, start, end, lambda s: s.busy)
    verify_cpu = sum(float(r.get("verify_cpu", 0.0)) for r in ranks)
    # at most 1: on windows a few samples long, interpolation can overshoot
    cpu_busy = min(1.0, max(0.0, busy - verify_cpu) / (cores * timed)) if busy is not None else None
    stolen = _delta(samples, start, end, lambda s: s.steal)
    cpu_steal = min(1.0, max(0.0, stolen) / (cores * timed)) if stolen is not None else None
    rank_of = {int(r["pid"]): int(r["rank"]) for r in ranks if r.get("pid") is not None}
    verify_of = {int(r["pid"]): float(r.get("verify_cpu", 0.0)) for r in ranks if r.get("pid") is not None}
    pids = {pid for s in samples for pid in s.procs}
    usage: Dict[int, float] = {}
    for pid in pids:
        used = _delta(samples, start, end, lambda s, p=pid: s.procs[p][0] if p in s.procs else None)
        if used is not None:
            usage[pid] = max(0.0, used - verify_of.get(pid, 0.0)) / timed
    busiest = max(usage, key=usage.get) if usage else None
    name = ""
    if busiest is not None:
        name = (f"rank {rank_of[busiest]}" if busiest in rank_of
                else next(s.procs[busiest][1] for s in samples if busiest in s.procs))
    link = None
    if host_mbit:
        worker_ns = {s.pid_ns[p] for s in samples for p in rank_of if p in s.pid_ns}
        other_ns = {ns for s in samples for p, ns in s.pid_ns.items() if p not in rank_of} - worker_ns
        busiest_link = []
        groups = ((lambda k: k.split("/", 1)[0] in worker_ns, host_mbit),
                  (lambda k: k.split("/", 1)[0] in other_ns, server_mbit),
                  (lambda k: k.startswith(f"{SWITCH}/up"), uplink_mbit))
        for belongs, mbit in groups:
            if not mbit:
                continue
            for key in {k for s in samples for k in s.links if belongs(k)}:
                for i in (0, 1):  # rx, tx
                    moved = _delta(samples, start, end, lambda s, k=key, i=i: s.links[k][i] if k in s.links else None)
                    if moved is not None:
                        busiest_link.append(moved * 8 / (mbit * 1e6 * timed))
        link = max(busiest_link) if busiest_link else None
    busiest_cpu = usage.get(busiest) if busiest is not None else None
    service = sum(u for pid, u in usage.items() if pid not in rank_of) if usage else None
    losses = _losses(samples, start, end) if host_mbit else (None, None)
    return {"cpu_busy": _round(cpu_busy), "cpu_steal": _round(cpu_steal),
            "busiest_process": name, "busiest_process_cpu": _round(busiest_cpu),
            "service_cpu": _round(service), "processes_cpu": _round(sum(usage.values())) if usage else None,
            "link_utilization": _round(link), "bound": classify(cpu_busy, busiest_cpu, link),
            "timed_seconds": _round(timed),
            "tcp_retransmits": losses[0], "tcp_timeouts": losses[1]}


def _losses(samples: Sequence[Sample], start: float, end: float) -> Tuple[Optional[int], Optional[int]]:
    """The TCP retransmits and timeouts of every namespace between the last sample at or before
    `start` and the first at or after `end` (counts of events: not interpolated, so one at the
    window's edge is counted rather than split); (None, None) without such samples."""
    before = [s for s in samples if s.t <= start]
    after = [s for s in samples if s.t >= end]
    if not before or not after or not before[-1].tcp:
        return None, None
    first, last = before[-1].tcp, after[0].tcp
    common = [ns for ns in first if ns in last]
    return (sum(last[ns][0] - first[ns][0] for ns in common), sum(last[ns][1] - first[ns][1] for ns in common))


def _round(x: Optional[float], digits: int = 4) -> Optional[float]:
    return None if x is None else round(float(x), digits)
