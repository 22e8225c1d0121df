"""Start a PHub job: its server(s) and N copies of a worker command, on the nodes of a cluster.

`run_job` is what `phub launch`, `phub selftest` and the harness's experiments use. Servers run as
`phub server` processes on the cluster's server nodes (this machine by default); once each has
printed its ready line, the workers start with the environment `phub.connect()` reads; one
server may serve several jobs. It blocks until the job ends: every worker exited 0 (status 0), or
a process failed; then the rest are stopped within a bounded time (SIGTERM, SIGKILL after 5 s)
and `failed` says who failed first. The processes run under `phub.launching.supervisor.Supervisor`.
"""
from __future__ import annotations

import dataclasses
import json
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..client.api import ENV_JOB, ENV_RANK, ENV_SERVER, ENV_TIMEOUT, ENV_TOKEN, ENV_WORKERS
from .cluster import Cluster, Node
from ..config import JobSpec, ServerConfig
from ..errors import ConfigError, PHubError
from .hosts import carried_line, on_node, torch_env
from .supervisor import Supervisor, exit_status

READY_TIMEOUT = 60.0
_JOIN_LAG = 2.0  # seconds a server's "joined" line, or else its exit, may trail its workers' exit


@dataclass
class JobResult:
    status: int
    failed: Optional[str] = None  # who failed first, in words
    worker_status: Dict[str, int] = field(default_factory=dict)  # by worker name, e.g. `rank 0`
    carried: Optional[str] = None  # what PHub carried, in one line (jobs, workers, bytes, rounds)


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
    """What the servers report on stdout (one thread each): the (job, rank) pairs that connected
    (`joined` lines), and the first job failure, with the rank that caused it (`failed` lines)."""

    def __init__(self):
        self.members: set = set()
        self.failure: Optional[dict] = None  # the first `failed` event: job, rank (or None), message
        self.ended: List[dict] = []  # `ended` events: what each core carried for a job that ended cleanly
        self.readers = 0  # servers whose stdout is still read
        self.changed = threading.Condition()

    def read(self, stream) -> None:
        with self.changed:
            self.readers += 1
        for line in iter(stream.readline, b""):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            with self.changed:
                if event.get("event") == "joined":
                    self.members.add((event.get("job"), event.get("rank")))
                elif event.get("event") == "failed" and self.failure is None:
                    self.failure = event
                elif event.get("event") == "ended":
                    self.ended.append(event)
                self.changed.notify_all()
        stream.close()
        with self.changed:
            self.readers -= 1
            self.changed.notify_all()

    def first_failure(self, wait: float) -> Optional[dict]:
        """The first job failure a server reported, after waiting up to `wait` seconds for one
        (less when every server has exited)."""
        with self.changed:
            self.changed.wait_for(lambda: self.failure is not None or self.readers == 0, wait)
            return self.failure

    def all_read(self, wait: float) -> None:
        """Wait up to `wait` seconds until every server's stdout has been read to its end."""
        with self.changed:
            self.changed.wait_for(lambda: self.readers == 0, wait)

    def missing(self, expected: Sequence[Tuple[int, int]], wait: float = 0.0) -> List[Tuple[int, int]]:
        """The `expected` (job, rank) pairs not reported yet, after waiting up to `wait` seconds."""
        with self.changed:
            self.changed.wait_for(lambda: self.members.issuperset(expected), wait)
            return [member for member in expected if member not in self.members]


# Run on a node (it may sit in another network namespace, where this process cannot bind): a base
# port P with P .. P+COUNT-1 free on every ADDRESS, printed; exits non-zero if 50 tries find none.
_PORT_PROBE = """
import socket, sys
count, addresses = int(sys.argv[1]), sys.argv[2:]
for _ in range(50):
    with socket.socket() as probe:
        probe.bind((addresses[0], 0))
        base = probe.getsockname()[1]
    try:
        if base + count > 65536:
            raise OSError("past the last port")
        for address in addresses:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind((address, port))
    except OSError:
        continue
    print(base)
    sys.exit(0)
sys.exit("no free ports after 50 tries")
"""


def free_port(node: Node, addresses: Optional[Sequence[str]] = None, count: int = 1) -> int:
    """A TCP port P, with P .. P+count-1 free on every one of `addresses` (default the node's
    first), probed on `node` itself. Blocks at most 60 s; raises PHubError if none is found."""
    addresses = list(addresses or node.addresses[:1])
    try:
        probe = subprocess.run(node.argv([sys.executable, "-c", _PORT_PROBE, str(count), *addresses]),
                               capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise PHubError(f"finding a free port on {node.name} took over 60 s") from None
    if probe.returncode != 0:
        raise PHubError(f"no {count} consecutive free port(s) on {node.name} ({', '.join(addresses)}): "
                        f"{probe.stderr.strip()}")
    return int(probe.stdout.strip())


def server_configs(cluster: Cluster, config: ServerConfig, num_workers: int) -> List[ServerConfig]:
    """The configuration of each server node: its jobs (one job of `num_workers`, or the jobs
    `config` lists, whose workers add up to it), the node's interfaces, its rack."""
    spec = config.jobs[0]
    if not cluster.hierarchical:
        jobs = config.jobs if len(config.jobs) > 1 else (JobSpec(spec.job_id, num_workers, spec.token),)
        return [dataclasses.replace(config, jobs=jobs, interfaces=node.addresses, once=True, report_joins=True)
                for node in cluster.servers]
    if len(config.jobs) > 1:
        raise ConfigError("several jobs run on one rack's PBox; a cross-rack run takes one job")
    port = config.port or cluster.extra.get("port") or free_port(
        cluster.servers[0], [a for node in cluster.servers for a in node.addresses], config.cores)
    # every interface of every PBox: core c / interface i of each rack links to core c / interface i of the others
    peers = tuple(f"{'+'.join(node.addresses)}:{port}" for node in cluster.servers)
    configs = []
    for rack, node in enumerate(cluster.servers):
        ranks = [w for w, worker in enumerate(cluster.workers) if worker.rack == rack]
        if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            raise PHubError(f"rack {rack}'s workers must have consecutive ranks, got {ranks}")
        job = JobSpec(spec.job_id, len(ranks), spec.token, ranks[0], num_workers)
        configs.append(dataclasses.replace(config, jobs=(job,), interfaces=node.addresses, once=True,
                                           port=port, rack=rack, peers=peers, report_joins=True))
    return configs


def _await_ready(proc: subprocess.Popen, node: Node, joins: _Joins) -> str:
    """The address in the server's ready line; the rest of its stdout is then read for `joins`."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            threading.Thread(target=joins.read, args=(proc.stdout,), daemon=True).start()
            return json.loads(line)["address"]
        if proc.poll() is not None:
            break
    raise PHubError(f"the phub server on {node.name} did not start (status {proc.poll()}); see its output above")


def _members(config: ServerConfig, num_workers: int) -> List[Tuple[int, int]]:
    """(job id, rank) of each worker node in order: the first job's ranks, then the next job's."""
    if len(config.jobs) == 1:
        return [(config.jobs[0].job_id, rank) for rank in range(num_workers)]
    if sum(spec.num_workers for spec in config.jobs) != num_workers:
        raise ConfigError(f"the jobs {[spec.job_id for spec in config.jobs]} have "
                          f"{sum(spec.num_workers for spec in config.jobs)} workers, not {num_workers}")
    return [(spec.job_id, rank) for spec in config.jobs for rank in range(spec.num_workers)]


def run_job(command: Sequence[str], num_workers: int, config: Optional[ServerConfig] = None,
            cluster: Optional[Cluster] = None, extra_env: Optional[Dict[str, str]] = None,
            prefix_output: bool = True, stdout=None, stderr=None, time_limit: Optional[float] = None,
            job_env: Optional[Dict[int, Dict[str, str]]] = None, torch_vars: bool = True) -> JobResult:
    """Run a job on `cluster` (default: one server on `config.interfaces` of this machine and
    `num_workers` local workers); block until it ends, or at most `time_limit` seconds (default: no
    limit; past it the job fails naming the workers still running). With several `config.jobs`
    (their workers adding up to `num_workers`) one server serves them all: the first job's ranks
    run on the first worker nodes, the next job's after them, each with `job_env[job id]` added to
    `extra_env`. Every worker also gets torch's variables (`phub.launching.hosts.torch_env`) unless
    `torch_vars` is False (a command that does not use torch.distributed: no port is probed for
    its store, which on a node reached through a prefix costs a process there). Worker
    output is streamed line by line with a `[rank R]` prefix (`[job J rank R]` with several jobs;
    `[NODE rank R]` on a hostfile's nodes), servers' with `[server NAME]`."""
    config = config or ServerConfig()
    if cluster is None:
        cluster = Cluster((Node("server", config.interfaces),),
                          tuple(Node(f"worker{w}", ("127.0.0.1",)) for w in range(num_workers)))
    if len(cluster.workers) != num_workers:
        raise PHubError(f"the cluster has {len(cluster.workers)} worker nodes for {num_workers} workers")
    members = _members(config, num_workers)
    specs = {spec.job_id: spec for spec in config.jobs}
    several = len(specs) > 1

    def name(job: int, rank: int) -> str:
        return f"job {job} rank {rank}" if several else f"rank {rank}"
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    result = JobResult(0)
    joins = _Joins()
    named_nodes = cluster.extra.get("network") == "hostfile"
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with Supervisor() as supervisor:
            addresses = {}
            started = []
            for node, node_config in zip(cluster.servers, server_configs(cluster, config, num_workers)):
                argv, _, stdin = on_node(node, [sys.executable, "-m", "phub", "server", *node_config.to_argv()], None)
                started.append((node, supervisor.start(
                    f"the phub server on {node.name}", argv, service=True, output=stderr, stdout=subprocess.PIPE,
                    prefix=f"[server {node.name}] " if prefix_output else "", stdin=stdin)))
            for node, proc in started:
                addresses[node.name] = _await_ready(proc, node, joins)
            nodes = {}  # process name -> its node's name
            sizes = {job: spec.num_workers if several else num_workers for job, spec in specs.items()}
            torch_by_worker = torch_env(members, cluster.workers, sizes) if torch_vars else [{} for _ in members]
            for index, ((job, rank), node) in enumerate(zip(members, cluster.workers)):
                nodes[name(job, rank)] = node.name
                address = ",".join(addresses[server.name] for server in cluster.servers_of(index))
                spec = specs[job]
                env = {**torch_by_worker[index], **(extra_env or {}), **(job_env or {}).get(job, {}),
                       **worker_env(address, rank, sizes[job], job, spec.token, config.timeout)}
                argv, env, stdin = on_node(node, command, env)
                label = f"{node.name} {name(job, rank)}" if named_nodes else name(job, rank)
                supervisor.start(name(job, rank), argv, env=env, output=stderr, stdout=stdout,
                                 prefix=f"[{label}] " if prefix_output else "", stdin=stdin)
            connect_by = time.monotonic() + config.connect_wait

            def never_connected() -> Optional[str]:
                if time.monotonic() > connect_by:
                    missing = joins.missing(members)
                    if missing:
                        return f"{_named(missing, several)} never connected to the phub server within " \
                               f"{config.connect_wait:g} s (--connect-timeout)"
                return None

            failure = supervisor.wait_workers(time_limit, never_connected)
            if supervisor.failed_worker or supervisor.failed_service:  # not a time limit, not the check above
                failure = _root_cause(failure, supervisor, joins, nodes, name)
            if failure and supervisor.failed_service and joins.missing(members):
                failure += f"; {_named(joins.missing(members), several)} never connected to it"
            if failure is None:
                # A `once` server exits 0 only after every rank of every job said BYE, so its clean
                # exit proves they all connected even when a `joined` line comes late.
                missing = joins.missing(members, _JOIN_LAG)
                if missing and supervisor.wait_services(_JOIN_LAG) is not None:
                    failure = f"{_named(missing, several)} exited (status 0) without ever connecting to the phub " \
                              f"server{_hints(supervisor, [name(*member) for member in missing])}"
            failure = failure or supervisor.wait_services()
            result.worker_status = dict(supervisor.worker_status)
            if not failure:
                joins.all_read(_JOIN_LAG)  # the servers have exited: their last events are on the way
                result.carried = carried_line(joins.ended, sizes)
            if failure:
                result.status, result.failed = 1, failure
    except KeyboardInterrupt:
        result.status, result.failed = 130, "interrupted"
    except PHubError as exc:
        result.status, result.failed = 1, str(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return result


def _root_cause(failure: str, supervisor: Supervisor, joins: _Joins, nodes: Dict[str, str], name) -> str:
    """The launcher's last word on a failed run (`failure`: what ended the wait): the process that
    failed first, its rank, node and last line (its exception's), not one that failed because of
    it. The server knows which worker ended the job (it reports it before acting on it), so its
    word comes first; else the worker that exited first."""
    reported = joins.first_failure(_JOIN_LAG) or {}
    if reported and reported.get("rank") is None:
        return f"{supervisor.failed_service or 'the phub server'} failed the job: {reported.get('message')}"
    culprit = name(reported.get("job"), reported.get("rank")) if reported else supervisor.failed_worker
    if culprit not in nodes:
        return failure  # a server failed on its own, a time limit, ranks that never connected
    code = supervisor.settle(culprit, _JOIN_LAG)
    # An error exit's last line is its exception's; a killed or running process's says nothing of why
    said = supervisor.last_lines.get(culprit) if code is not None and code > 0 else None
    words = f"{culprit} on {nodes[culprit]} failed first" + (f" ({exit_status(code)})" if code else "")
    detail = said or reported.get("message")
    return f"{words}: {detail}" if detail else words


def _hints(supervisor: Supervisor, names: List[str]) -> str:
    """What the workers `names` said last as a hint (a `phub: hint:` line: a likely cause phub
    knows), once each, as `; HINT`."""
    hints = dict.fromkeys(line[len("phub: "):] for line in (supervisor.last_lines.get(n, "") for n in names)
                          if line.startswith("phub: hint:"))
    return "".join(f"; {hint}" for hint in hints)


def _named(members: List[Tuple[int, int]], several_jobs: bool) -> str:
    """`rank(s) [0, 1]` for one job's workers, `job 1 rank 0, job 2 rank 1` for several jobs'."""
    if several_jobs:
        return ", ".join(f"job {job} rank {rank}" for job, rank in members)
    return f"rank(s) {[rank for _, rank in members]}"


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
