"""Run the software-cost experiment (`python -m experiments bench software-cost`).

Every system on unshaped loopback, compute removed, the models at full size, two message-size
settings where a system has the knob (`softcost.default_settings`). Each (system, model,
setting) is one start of the system's processes (`runner.run_exchanges`: one warm-up, then
`repeats` blocks of timed iterations) while

* a `ThreadSampler` reads every thread's CPU time of every process started under this one
  (/proc/PID/task/TID/schedstat, nanoseconds) and the system call it waits in, every PERIOD;
* where perf may sample every process (root, or kernel.perf_event_paranoid <= 0), a `Perf`
  recording samples the whole machine once per millisecond of CPU on the same clock, for the
  breakdown by kind of code of the PS systems.

Each block's window (from the runner's row `windows`, CLOCK_MONOTONIC) cuts both to the timed
iterations; `experiments.softcost` turns them into rows, written atomically to
OUT/SYSTEM-MODEL-SETTING.csv (roles) and ...-breakdown.csv. A file that exists is kept (a rerun
resumes). On a machine shared with other work, CPU seconds are the robust figure, not wall time;
each row carries the block's cpu_steal.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from phub.launching.arguments import int_in, seconds
from phub.errors import ConfigError, PHubError

from . import softcost
from .fileio import write_csv
from .layouts import MODELS
from .models import load_model
from .monitor import _descendants
from .runner import Options, run_exchanges
from .systems import SYSTEMS

PERIOD = 0.05  # seconds between thread samples: short against a block of about a second
PERF_PERIOD_NS = 1_000_000  # perf's cpu-clock period: one sample per millisecond of CPU
PERF_STOP_TIMEOUT = 30.0  # seconds perf may take to write its file after SIGINT
BREAKDOWN_SYSTEMS = ("phub", "pshard", "pslite-central", "pslite-shard")  # PS systems whose code perf names
DEFAULT_MODELS = ("resnet269", "inception-v3", "googlenet", "alexnet")  # the paper's breakdown chart's four
DEFAULT_BLOCK_MB = 200.0
# Warm-up exchanges before the first block, and at least 2 exchanges a block: with 1 of each, the
# first block of ResNet-269 (one exchange) took 1.5 s of phub's server CPU and the second 0.42 s.
WARMUP = 3


class ThreadSampler:
    """Samples the CPU time of every thread below this process in a background thread, from
    `start()` (or `with`) to `stop()`; `traces()` are the `softcost.ThreadTrace`s. Processes are
    looked up again every RESCAN samples (a scan of /proc costs more than a sample)."""

    RESCAN = 4

    def __init__(self, period: float = PERIOD):
        self.period = period
        self._traces: Dict[tuple, softcost.ThreadTrace] = {}
        self._workers: Dict[int, bool] = {}  # pid -> is an exchange worker (once its command says so)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="softcost-sampler", daemon=True)
        self._pids: List[int] = []

    def __enter__(self) -> "ThreadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def traces(self) -> List[softcost.ThreadTrace]:
        return list(self._traces.values())

    def _run(self) -> None:
        count = 0
        while True:
            if count % self.RESCAN == 0:
                self._pids = _descendants(os.getpid())
            count += 1
            self._sample()
            if self._stop.wait(self.period):
                self._sample()
                return

    def _sample(self) -> None:
        for pid in self._pids:
            if not self._workers.get(pid):
                self._workers[pid] = _is_worker(pid)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                read = _read_thread(pid, int(tid))
                if read is None:
                    continue
                cpu, wait, call, name = read
                key = (pid, int(tid))
                trace = self._traces.get(key)
                if trace is None:
                    trace = self._traces[key] = softcost.ThreadTrace(pid, int(tid), name, False)
                trace.is_worker = self._workers[pid]
                trace.name = name  # a thread may name itself after it starts
                now = time.monotonic()
                trace.points.append((now, cpu))
                trace.waits.append((now, wait))
                trace.blocked[call] += 1


def _is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"experiments.worker" in f.read().split(b"\0")
    except OSError:
        return False


def _read_thread(pid: int, tid: int):
    """(CPU seconds, run-queue wait seconds, system call it waits in or "running", name) of a
    thread; None once it is gone."""
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            fields = f.read().split()
        cpu, wait = int(fields[0]) / 1e9, int(fields[1]) / 1e9
        with open(f"{base}/syscall") as f:
            call = (f.read().split() or [""])[0]
        with open(f"{base}/comm") as f:
            name = f.read().strip()
    except (OSError, ValueError, IndexError):
        return None
    return cpu, wait, call, name


def perf_usable() -> Optional[str]:
    """None when perf can sample every process here, else why not."""
    if shutil.which("perf") is None:
        return "perf is not on PATH"
    try:
        with open("/proc/sys/kernel/perf_event_paranoid") as f:
            paranoid = int(f.read())
    except (OSError, ValueError):
        return "kernel.perf_event_paranoid cannot be read"
    if paranoid > 0 and os.geteuid() != 0:
        return f"kernel.perf_event_paranoid is {paranoid} and this is not root"
    return None


class Perf:
    """`perf record` of the whole machine (cpu-clock, one sample per PERF_PERIOD_NS of CPU, on
    CLOCK_MONOTONIC) while the block runs. perf is started detached (its parent exits at once),
    so it is not below this process and neither the runner's monitor nor the sampler counts its
    CPU. `lines(pids)`: the samples of those processes, as `perf script` prints them.
    Raises PHubError when perf fails to start or to stop within PERF_STOP_TIMEOUT."""

    def __init__(self, folder: str):
        self.data = os.path.join(folder, "perf.data")
        self.log = os.path.join(folder, "perf.log")
        self.pid: Optional[int] = None

    def __enter__(self) -> "Perf":
        command = (f"perf record -a -q -e cpu-clock -c {PERF_PERIOD_NS} -k CLOCK_MONOTONIC "
                   f"-o '{self.data}' >'{self.log}' 2>&1 </dev/null & echo $!")
        started = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
        try:
            self.pid = int(started.stdout.strip())
        except ValueError:
            raise PHubError(f"perf record did not start: {started.stderr.strip()[-300:]}") from None
        self._pidfd = os.pidfd_open(self.pid)
        return self

    def __exit__(self, *exc) -> None:
        try:
            os.kill(self.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        ready, _, _ = select.select([self._pidfd], [], [], PERF_STOP_TIMEOUT)  # readable once perf exited
        os.close(self._pidfd)
        if not ready:
            os.kill(self.pid, signal.SIGKILL)
            raise PHubError(f"perf record (pid {self.pid}) did not stop within {PERF_STOP_TIMEOUT:g} s")

    def lines(self, pids: Iterable[int]) -> List[str]:
        wanted = ",".join(str(p) for p in sorted(set(pids)))
        script = subprocess.run(["perf", "script", "-i", self.data, "--pid", wanted, "-F", "pid,tid,time,ip,sym,dso"],
                                capture_output=True, text=True, timeout=300)
        if script.returncode != 0:
            log = Path(self.log).read_text()[-300:] if os.path.exists(self.log) else ""
            raise PHubError(f"perf script failed (exit {script.returncode}): {script.stderr.strip()[-300:]} {log}")
        return script.stdout.splitlines()


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("" where it does not)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        return ""


def server_processes(system: str, row: dict, workers: int) -> int:
    """The server processes that serve the job (the scheduler and launchers not counted)."""
    if system == "gloo-ring":
        return 0
    if system in ("phub", "pshard"):
        return row["servers"] * row["cores"]
    return row["servers"]


def measure(system: str, model: str, setting: softcost.Setting, workers: int = 2, repeats: int = 2,
            block_bytes: float = DEFAULT_BLOCK_MB * 1e6, with_perf: bool = True, cores: int = 1,
            time_limit: float = 300.0, facts: Optional[dict] = None) -> tuple:
    """One (system, model, setting): (role rows, breakdown rows; empty without perf or for gloo).
    Blocks for the run; raises PHubError naming what failed."""
    loaded = load_model(model)
    iterations = softcost.iterations_for(loaded, block_bytes, least=2)
    options = Options(network="loopback", compute="zero", cores=cores, time_limit=time_limit,
                      chunk_bytes=setting.chunk_bytes or Options.chunk_bytes,
                      bigarray_bound=setting.bigarray_bound or Options.bigarray_bound)
    breakdown = with_perf and system in BREAKDOWN_SYSTEMS
    with tempfile.TemporaryDirectory(prefix="phub-softcost-") as folder:
        perf = Perf(folder) if breakdown else None
        with ThreadSampler() as sampler, perf or contextlib.nullcontext():
            rows = run_exchanges(system, model, workers, iterations, WARMUP, options=options, quiet=True,
                                 repeats=repeats)
        traces = sampler.traces()
        lines = perf.lines({t.pid for t in traces}) if perf else []
    facts = facts or {"git_commit": git_commit(), "host": platform.node(), "cpu_model": cpu_model(),
                      "machine_cores": os.cpu_count() or ""}
    servers = server_processes(system, rows[0], workers)
    flows = softcost.traffic(loaded, system, workers, rows[0].get("servers", 0) if system != "gloo-ring" else 0,
                             setting)
    run = dict(facts, system=system, model=model, workers=workers, servers=servers,
               cores=cores if system in ("phub", "pshard") else "", message_setting=setting.label,
               compute_seconds_per_iteration=loaded.profile.seconds_per_iteration if loaded.profile else "")
    role_rows, breakdown_rows = [], []
    for row in rows:
        try:
            window = softcost.block_window(row.get("windows"))
        except ValueError as exc:
            raise PHubError(f"{system} {model}: block {row['repeat']}: {exc}") from None
        # the monitor's CPU of every process (a rate, in cores) over the same span: a check on the sampler
        bound = row.get("bound") or {}
        rate = bound.get("processes_cpu")
        block = softcost.Block(row["repeat"], row["iterations"], row["seconds_per_iteration"], window,
                               None if rate is None else rate * (window[1] - window[0]), bound.get("cpu_steal"))
        role_rows += softcost.role_rows(run, block, softcost.cpu_by_role(traces, system, block.window), flows,
                                        softcost.wait_by_role(traces, system, block.window),
                                        softcost.busiest_thread_share(traces, system, block.window))
        if breakdown:
            pids = {t.pid for t in traces}
            by_category = softcost.breakdown(lines, pids, block.window, PERF_PERIOD_NS / 1e9)
            breakdown_rows += softcost.breakdown_rows(run, block, by_category, len(pids), flows)
    return role_rows, breakdown_rows


def run_experiment(out: str, systems: Sequence[str], models: Sequence[str], workers: int = 2, repeats: int = 2,
                   block_mb: float = DEFAULT_BLOCK_MB, chunk_kb: Sequence[int] = (32, 4),
                   bigarray_bounds: Sequence[int] = (1000 * 1000, 1000), with_perf: Optional[bool] = None,
                   time_limit: float = 300.0, log=sys.stderr) -> List[Path]:
    """Every (system, model, setting) not yet in `out`; returns the files written. `with_perf`
    None: when perf is usable here (else the breakdown files are left out, saying why)."""
    for name in systems:
        if name not in SYSTEMS:
            raise ConfigError(f"software cost: unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    for name in models:
        load_model(name)  # ConfigError naming a bad model, before anything runs
    if workers < 2:
        raise ConfigError("software cost: needs at least 2 workers (one exchanges nothing)")
    why_not = perf_usable()
    if with_perf is None:
        with_perf = why_not is None
        if why_not:
            print(f"software cost: no breakdown by kind of code ({why_not})", file=log)
    elif with_perf and why_not:
        raise ConfigError(f"software cost: the breakdown needs perf: {why_not}")
    facts = {"git_commit": git_commit(), "host": platform.node(), "cpu_model": cpu_model(),
             "machine_cores": os.cpu_count() or ""}
    settings = softcost.default_settings(chunk_kb, bigarray_bounds)
    written = []
    for system in systems:
        for model in models:
            for setting in settings[system]:
                stem = Path(out) / f"{system}-{model}-{setting.label}"
                roles, parts = Path(f"{stem}.csv"), Path(f"{stem}-breakdown.csv")
                wants_parts = with_perf and system in BREAKDOWN_SYSTEMS
                if roles.exists() and (parts.exists() or not wants_parts):
                    continue
                started = time.monotonic()
                role_rows, breakdown_rows = measure(system, model, setting, workers, repeats, block_mb * 1e6,
                                                    with_perf, time_limit=time_limit, facts=facts)
                written.append(write_csv(roles, role_rows, softcost.COLUMNS))
                if breakdown_rows:
                    written.append(write_csv(parts, breakdown_rows, softcost.COLUMNS))
                print(summary(role_rows, time.monotonic() - started), file=log, flush=True)
    return written


def summary(rows: List[dict], wall: float) -> str:
    """One line: CPU milliseconds per exchange by role (median over repeats) and the wall time."""
    first = rows[0]
    cells = []
    for role in softcost.ROLES:
        values = sorted(r["cpu_seconds_per_exchange"] for r in rows if r["role"] == role)
        cells.append(f"{role} {values[len(values) // 2] * 1e3:.0f}")
    return (f"{first['system']} {first['model']} {first['message_setting']}: ms of CPU per exchange: "
            f"{', '.join(cells)}; {first['seconds_per_iteration'] * 1e3:.0f} ms per iteration; took {wall:.0f} s")


def add_parser(bench) -> None:
    """`bench software-cost` under the harness's `bench` commands."""
    sub = bench.add_parser("software-cost", help="CPU seconds per exchange by role and kind of code, every system "
                                                 "on unshaped loopback with full-size models (the paper's breakdown)")
    sub.add_argument("--out", required=True, help="folder for the CSV files (one per system, model and setting)")
    sub.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    sub.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                     help=f"model layouts (default {' '.join(DEFAULT_MODELS)}; any of {', '.join(MODELS)} or "
                          "synthetic:SIZE_MB)")
    sub.add_argument("--workers", type=int_in(2, 64), default=2)
    sub.add_argument("--repeats", type=int_in(1, 100), default=2, help="timed blocks per run (default 2)")
    sub.add_argument("--block-mb", type=_megabytes, default=DEFAULT_BLOCK_MB,
                     help="each block has enough iterations that a worker moves this many MB (default %(default)g)")
    sub.add_argument("--chunk-kb", type=int_in(1, 16 * 1024), nargs="+", default=[32, 4],
                     help="phub, pshard: chunk sizes (KB)")
    sub.add_argument("--bigarray-bounds", type=int_in(1, 10**9), nargs="+", default=[1000 * 1000, 1000],
                     help="pslite-shard: MXNET_KVSTORE_BIGARRAY_BOUND values (elements); pslite-central runs the first")
    sub.add_argument("--perf", choices=("auto", "yes", "no"), default="auto",
                     help="breakdown by kind of code with perf: auto (when perf can sample every process), yes, no")
    sub.add_argument("--time-limit", type=seconds, default=300.0, help="seconds each run may take (default 300)")
    sub.set_defaults(func=_command)


def _megabytes(text: str) -> float:
    """An argparse type: megabytes in (0, 100000] (NaN and infinities refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1e5:
        raise argparse.ArgumentTypeError(f"must be in (0, 100000] MB, got {text}")
    return value


def _command(args) -> int:
    with_perf = {"auto": None, "yes": True, "no": False}[args.perf]
    run_experiment(args.out, args.systems, args.models, args.workers, args.repeats, args.block_mb, args.chunk_kb,
                   args.bigarray_bounds, with_perf, args.time_limit, log=sys.stdout)
    return 0
