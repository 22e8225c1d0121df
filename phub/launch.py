"""Start a PHub job: its server(s) and N copies of a worker command, on the nodes of a cluster.

`run_job` is what `phub launch`, `phub bench` and the experiments use. Servers run as
`phub server` processes on the cluster's server nodes (this machine by default); once each has
printed its ready line, the workers start with the environment `phub.connect()` reads. It blocks
until the job ends: every worker exited 0 (status 0), or a process failed; then the rest are
stopped within a bounded time (SIGTERM, SIGKILL after 5 s) and `failed` says who failed first.
"""
from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .client import ENV_JOB, ENV_RANK, ENV_SERVER, ENV_TIMEOUT, ENV_TOKEN, ENV_WORKERS
from .cluster import Cluster, Node
from .config import JobSpec, ServerConfig
from .errors import ConfigError, PHubError

_GRACE = 5.0  # seconds a stopped process gets between SIGTERM and SIGKILL
READY_TIMEOUT = 60.0
_JOIN_LAG = 2.0  # seconds a server's "joined" line may trail its worker's exit (a pipe and a thread)


@dataclass
class JobResult:
    status: int
    failed: Optional[str] = None  # who failed first, in words
    worker_status: Dict[int, Optional[int]] = field(default_factory=dict)


def own_python(command: Sequence[str]) -> List[str]:
    """`command` with a first word of `python` or `python3` replaced by the interpreter running
    this launcher (`sys.executable`): the one phub, and what it was installed with, live in,
    whether or not its environment is activated. Any other first word (a path such as
    /usr/bin/python3 included) runs as given."""
    command = list(command)
    if command and command[0] in ("python", "python3") and sys.executable:
        command[0] = sys.executable
    return command


def worker_env(address: str, rank: int, num_workers: int, job_id: int = 0, token: str = "",
               timeout: Optional[float] = None) -> Dict[str, str]:
    """The environment variables `phub.connect()` reads (`address`: one server, or shards joined by commas)."""
    env = {ENV_SERVER: address, ENV_RANK: str(rank), ENV_WORKERS: str(num_workers),
           ENV_JOB: str(job_id), ENV_TOKEN: token}
    if timeout is not None:
        env[ENV_TIMEOUT] = str(timeout)
    return env


class _Joins:
    """The ranks the servers reported connected (their `joined` lines, read by one thread each)."""

    def __init__(self):
        self.ranks: set = set()
        self.changed = threading.Condition()

    def read(self, stream) -> None:
        for line in iter(stream.readline, b""):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "joined":
                with self.changed:
                    self.ranks.add(event.get("rank"))
                    self.changed.notify_all()
        stream.close()

    def missing(self, num_workers: int, wait: float = 0.0) -> List[int]:
        """The ranks not reported yet, after waiting up to `wait` seconds for them."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.ranks & set(range(num_workers))) == num_workers, wait)
            return sorted(set(range(num_workers)) - self.ranks)


def _pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, b""):
        sink.buffer.write(prefix.encode() + line)
        sink.flush()
    stream.close()


def stop_processes(processes: Sequence[subprocess.Popen], grace: float = _GRACE) -> None:
    """SIGTERM every process group still running, then SIGKILL what is left after `grace` seconds
    (each process must lead its own group: start it with start_new_session=True)."""
    for proc in processes:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for proc in processes:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _free_port(addresses: Sequence[str], count: int) -> int:
    """A base port with `count` consecutive ports free on every address (rack servers need fixed ports)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            base = probe.getsockname()[1]
        if base + count >= 65536:
            continue
        try:
            for address in addresses:
                for port in range(base, base + count):
                    with socket.socket() as sock:
                        sock.bind((address, port))
            return base
        except OSError:
            continue
    raise PHubError(f"no {count} consecutive free ports on {list(addresses)}")


def server_configs(cluster: Cluster, config: ServerConfig, num_workers: int) -> List[ServerConfig]:
    """The configuration of each server node: one job, the node's interfaces, its rack."""
    spec = config.jobs[0]
    if not cluster.hierarchical:
        job = JobSpec(spec.job_id, num_workers, spec.token)
        return [dataclasses.replace(config, jobs=(job,), interfaces=node.addresses, once=True, report_joins=True)
                for node in cluster.servers]
    port = config.port or cluster.extra.get("port") or _free_port(
        [a for node in cluster.servers for a in node.addresses], config.cores)
    peers = tuple(f"{node.addresses[0]}:{port}" for node in cluster.servers)
    configs = []
    for rack, node in enumerate(cluster.servers):
        ranks = [w for w, worker in enumerate(cluster.workers) if worker.rack == rack]
        if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            raise PHubError(f"rack {rack}'s workers must have consecutive ranks, got {ranks}")
        job = JobSpec(spec.job_id, len(ranks), spec.token, ranks[0], num_workers)
        configs.append(dataclasses.replace(config, jobs=(job,), interfaces=node.addresses, once=True,
                                           port=port, rack=rack, peers=peers, report_joins=True))
    return configs


def _start_server(node: Node, config: ServerConfig, stderr_sink, prefix: str) -> tuple:
    argv = node.argv([sys.executable, "-m", "phub", "server", *config.to_argv()])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    threading.Thread(target=_pump, args=(proc.stderr, prefix, stderr_sink), daemon=True).start()
    return proc


def _await_ready(proc: subprocess.Popen, node: Node, joins: Optional[_Joins] = None) -> str:
    """The address in the server's ready line; the rest of its stdout is then read for `joins`
    (or drained and dropped)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            reader = (joins.read, (proc.stdout,)) if joins else (_pump, (proc.stdout, "", open(os.devnull, "w")))
            threading.Thread(target=reader[0], args=reader[1], daemon=True).start()
            return json.loads(line)["address"]
        if proc.poll() is not None:
            break
    raise PHubError(f"the phub server on {node.name} did not start (status {proc.poll()}); see its output above")


def start_server(node: Node, config: ServerConfig, stderr=None, prefix: str = "") -> Tuple[subprocess.Popen, str]:
    """Start `phub server` with `config` on `node` (several jobs, if it lists them); block until it
    is ready (at most READY_TIMEOUT seconds) and return the process and the address workers pass
    to `phub.connect`. Raises PHubError if it does not start. Stop it with `stop_processes`."""
    proc = _start_server(node, config, stderr or sys.stderr, prefix)
    try:
        return proc, _await_ready(proc, node)
    except BaseException:
        stop_processes([proc])
        raise


def run_job(command: Sequence[str], num_workers: int, config: Optional[ServerConfig] = None,
            cluster: Optional[Cluster] = None, extra_env: Optional[Dict[str, str]] = None,
            prefix_output: bool = True, stdout=None, stderr=None) -> JobResult:
    """Run one job on `cluster` (default: one server on `config.interfaces` of this machine and
    `num_workers` local workers); block until it ends. Worker output is streamed line by line
    with a `[rank R]` prefix, servers' with `[server NAME]`."""
    config = config or ServerConfig()
    if cluster is None:
        cluster = Cluster((Node("server", config.interfaces),),
                          tuple(Node(f"worker{w}", ("127.0.0.1",)) for w in range(num_workers)))
    if len(cluster.workers) != num_workers:
        raise PHubError(f"the cluster has {len(cluster.workers)} worker nodes for {num_workers} workers")
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    spec = config.jobs[0]
    processes: List[subprocess.Popen] = []
    servers: Dict[str, subprocess.Popen] = {}
    result = JobResult(0)
    joins = _Joins()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        addresses = []
        for node, node_config in zip(cluster.servers, server_configs(cluster, config, num_workers)):
            proc = _start_server(node, node_config, stderr, f"[server {node.name}] " if prefix_output else "")
            servers[node.name] = proc
            processes.append(proc)
        for node in cluster.servers:
            addresses.append(_await_ready(servers[node.name], node, joins))
        workers = []
        for rank, node in enumerate(cluster.workers):
            address = ",".join(addresses[cluster.servers.index(s)] for s in cluster.servers_of(rank))
            env = dict(os.environ, **(extra_env or {}),
                       **worker_env(address, rank, num_workers, spec.job_id, spec.token, config.timeout))
            proc = subprocess.Popen(node.argv(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            workers.append(proc)
            processes.append(proc)
            tag = f"[rank {rank}] " if prefix_output else ""
            for stream, sink in ((proc.stdout, stdout), (proc.stderr, stderr)):
                threading.Thread(target=_pump, args=(stream, tag, sink), daemon=True).start()
        result = _supervise(workers, servers, joins, config.timeout)
    except KeyboardInterrupt:
        result.status, result.failed = 130, "interrupted"
    except PHubError as exc:
        result.status, result.failed = 1, str(exc)
    finally:
        stop_processes(processes)
        signal.signal(signal.SIGTERM, previous)
    return result


ENV_RESTART = "PHUB_RESTART_COUNT"  # which start of the job a worker is in (0: the first)


def run_with_restarts(command: Sequence[str], num_workers: int, config: Optional[ServerConfig] = None,
                      max_restarts: int = 0, log=None, **options) -> JobResult:
    """`run_job`, started again from scratch (a new server, new workers) after a failure, up to
    `max_restarts` times; not after an interrupt. Workers find their start's number in
    PHUB_RESTART_COUNT; a script resumes from the checkpoint it wrote itself (weights and
    `Client.optimizer_state`). Returns the last start's result."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts must be a non-negative integer, got {max_restarts!r}")
    extra = dict(options.pop("extra_env", None) or {})
    for attempt in range(max_restarts + 1):
        result = run_job(command, num_workers, config, extra_env={**extra, ENV_RESTART: str(attempt)}, **options)
        if result.status == 0 or result.status == 130 or attempt == max_restarts:
            return result
        print(f"phub launch: {result.failed}; restarting the job ({attempt + 1} of {max_restarts})",
              file=log or sys.stderr, flush=True)
    return result


def _blame(failed: List[Tuple[int, int]]) -> str:
    """Name the worker whose failure came first among those seen in one poll: one killed by a
    signal over one that exited with an error, as the others exit when the server tells them a
    worker was lost."""
    rank, code = min(failed, key=lambda item: (item[1] > 0, item[0]))
    message = f"rank {rank} exited with status {code}"
    if code < 0:
        message += f" ({signal.Signals(-code).name})" if -code in signal.valid_signals() else ""
    others = sorted(r for r, _ in failed if r != rank)
    return message + (f"; rank(s) {others} failed with it" if others else "")


def _supervise(workers: List[subprocess.Popen], servers: Dict[str, subprocess.Popen], joins: _Joins,
               timeout: float) -> JobResult:
    """Wait for the workers, then the servers; stop at the first failure, or when a worker has not
    connected within `timeout` seconds, or when the workers have exited and some never connected."""
    result = JobResult(0)
    running = dict(enumerate(workers))
    connect_deadline = time.monotonic() + timeout

    def never(missing: List[int], how: str) -> JobResult:
        result.status, result.failed = 1, f"rank(s) {missing} {how}"
        return result

    while running:
        failed = []
        for rank, proc in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            del running[rank]
            result.worker_status[rank] = code
            if code != 0:
                failed.append((rank, code))
        if failed:
            result.status, result.failed = 1, _blame(failed)
            return result
        for name, proc in servers.items():
            code = proc.poll()
            if code not in (None, 0):
                missing = joins.missing(len(workers))
                result.status, result.failed = 1, f"the phub server on {name} failed (status {code})" + (
                    f"; rank(s) {missing} never connected to it" if missing else "")
                return result
        if time.monotonic() > connect_deadline:
            missing = joins.missing(len(workers))
            if missing:
                return never(missing, f"never connected to the phub server within {timeout:g} s (--timeout)")
        time.sleep(0.05)  # polling interval of the supervisor, not a synchronization
    missing = joins.missing(len(workers), _JOIN_LAG)
    if missing:
        return never(missing, "exited (status 0) without ever connecting to the phub server")
    deadline = time.monotonic() + 30.0
    for name, proc in servers.items():
        try:
            code = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            result.status, result.failed = 1, f"the phub server on {name} did not exit within 30 s after the workers"
            return result
        if code != 0:
            result.status, result.failed = 1, f"the phub server on {name} did not finish cleanly (status {code})"
            return result
    return result
