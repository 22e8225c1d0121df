"""Validated parameter objects of a PHub server: the jobs it accepts and how it is laid out."""
from __future__ import annotations

import math
import socket
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .reduction.chunking import DEFAULT_CHUNK_BYTES, Topology, chunk_elements
from .network.datapath import DEFAULT_TRANSPORT, PATHS
from .errors import ConfigError

MAX_TIMEOUT = 10**6  # seconds (11 days): what every wait may be given, and still finite
# How long a job's workers may take to connect once the first has (at most the server's timeout):
# the others learn who is missing then, not after a step's whole timeout.
DEFAULT_CONNECT_TIMEOUT = 60.0
MIN_JOB_BYTES, DEFAULT_MAX_JOB_BYTES = 1 << 20, 2 << 30  # a job's registered values: see protocol/messages.py
MAX_CORES = 1024  # server processes, one per core: far beyond a PBox's 28 threads
MAX_LANES = 4096  # connections a worker opens to one server (interfaces x cores x lanes per pair), as HELLO allows
MAX_PORT = 65535
MAX_SIMULATED_RACKS = 64  # the paper simulated up to 8


def check_timeout(value, name: str = "timeout") -> float:
    """A timeout in seconds: a number in (0, MAX_TIMEOUT]; ConfigError names `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_TIMEOUT:
        raise ConfigError(f"{name} must be a number of seconds in (0, {MAX_TIMEOUT}], got {value!r}")
    return float(value)


def check_peer(text) -> Tuple[Tuple[str, ...], int]:
    """A rack server's addresses HOST[+HOST...]:PORT: its interfaces' IPv4 addresses in interface
    order (the first is its discovery address) and its base port 1..65535."""
    hosts, sep, port = str(text).rpartition(":")
    addresses = tuple(hosts.split("+"))
    try:
        for host in addresses:
            socket.inet_aton(host)
        number = int(port)
    except (OSError, ValueError):
        number = -1
    if not sep or not 1 <= number < 65536 or any(host.count(".") != 3 for host in addresses):
        raise ConfigError(f"--peers: {text!r} is not IPv4-HOST[+IPv4-HOST...]:PORT")
    return addresses, number

Endpoint = Tuple[str, int]
TRANSPORTS = tuple(PATHS)  # "tcp", "verbs", "soft-verbs": the data paths' registry


@dataclass(frozen=True)
class JobSpec:
    """A job the server accepts: its id, how many workers it has, and the token they present."""

    job_id: int = 0
    num_workers: int = 1  # the workers this server serves
    token: str = ""
    first_rank: int = 0  # they are ranks first_rank .. first_rank + num_workers - 1 ...
    total_workers: Optional[int] = None  # ... of this many in the job (default num_workers)

    def __post_init__(self):
        if not isinstance(self.job_id, int) or not 0 <= self.job_id < 2**32:
            raise ConfigError(f"JobSpec.job_id must be an integer in [0, 2**32), got {self.job_id!r}")
        if not isinstance(self.num_workers, int) or not 1 <= self.num_workers <= 4096:
            raise ConfigError(f"JobSpec.num_workers must be an integer in [1, 4096], got {self.num_workers!r}")
        if not isinstance(self.token, str):
            raise ConfigError("JobSpec.token must be a string")
        total = self.num_workers if self.total_workers is None else self.total_workers
        if not isinstance(self.first_rank, int) or not isinstance(total, int) or \
                not 0 <= self.first_rank <= total - self.num_workers:
            raise ConfigError(f"JobSpec: ranks {self.first_rank}..{self.first_rank + self.num_workers - 1} "
                              f"do not fit in a job of {total} workers")
        object.__setattr__(self, "total_workers", total)

    @classmethod
    def parse(cls, text: str) -> "JobSpec":
        """`ID:WORKERS[:TOKEN]` or `ID:FIRST-LAST/TOTAL[:TOKEN]` (ranks FIRST..LAST of TOTAL, for a
        rack's server), as the `--job` option takes it."""
        parts = text.split(":", 2)
        try:
            token = parts[2] if len(parts) > 2 else ""
            if "/" in parts[1]:
                ranks, total = parts[1].split("/")
                first, last = (int(x) for x in ranks.split("-"))
                return cls(int(parts[0]), last - first + 1, token, first, int(total))
            return cls(int(parts[0]), int(parts[1]), token)
        except (IndexError, ValueError):
            raise ConfigError(f"--job {text!r}: expected ID:WORKERS[:TOKEN] or ID:FIRST-LAST/TOTAL[:TOKEN]") from None

    def to_option(self) -> str:
        """The inverse of `parse`."""
        last = self.first_rank + self.num_workers - 1
        return f"{self.job_id}:{self.first_rank}-{last}/{self.total_workers}:{self.token}"


@dataclass(frozen=True)
class ServerConfig:
    """Validated server parameters. `timeout` bounds how long a job may stall before it is failed."""

    jobs: Tuple[JobSpec, ...] = (JobSpec(),)
    interfaces: Tuple[str, ...] = ("127.0.0.1",)
    cores: int = 1
    port: int = 0
    lanes_per_pair: int = 1
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    once: bool = False  # exit when every job has ended (what the launcher wants)
    timeout: float = 300.0
    rack: int = 0  # with peers: this server's rack index ...
    peers: Tuple[str, ...] = ()  # ... and every rack server's HOST[+HOST...]:PORT (its interfaces), in rack order
    transport: str = DEFAULT_TRANSPORT  # "tcp", or "verbs" (refused at start unless it can run here, see phub doctor),
    # or "soft-verbs" (the verbs data path over phub.network.rdma.soft: one machine, no device needed)
    rdma_devices: Tuple[str, ...] = ()  # with verbs: the RDMA port ("NAME[:PORT]") of each interface
    max_job_bytes: int = DEFAULT_MAX_JOB_BYTES  # the values one job may register (its arrays' bytes)
    report_joins: bool = False  # print JSON lines on stdout for the launcher: a rank connected, a job failed
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT  # see connect_wait
    # > 1: this one PBox stands in for that many racks, as the paper measured beyond a rack
    # (phub.reduction.hierarchy.SimulatedRacksJobState); not with peers
    simulated_racks: int = 1

    def __post_init__(self):
        object.__setattr__(self, "jobs", tuple(self.jobs))
        object.__setattr__(self, "interfaces", tuple(self.interfaces))
        if not self.jobs:
            raise ConfigError("ServerConfig.jobs: at least one job is needed")
        ids = [j.job_id for j in self.jobs]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"ServerConfig.jobs: job ids must be distinct, got {ids}")
        if not self.interfaces or len(set(self.interfaces)) != len(self.interfaces):
            raise ConfigError(f"ServerConfig.interfaces must be distinct addresses, got {list(self.interfaces)}")
        for address in self.interfaces:
            try:
                socket.inet_aton(address)
            except OSError:
                raise ConfigError(f"ServerConfig.interfaces: {address!r} is not an IPv4 address") from None
        lanes = Topology(len(self.interfaces), self.cores, self.lanes_per_pair).lanes  # validates both counts
        if self.cores > MAX_CORES:
            raise ConfigError(f"ServerConfig.cores (--cores) must be at most {MAX_CORES}, got {self.cores}")
        if lanes > MAX_LANES:
            raise ConfigError(f"ServerConfig: {len(self.interfaces)} interface(s) x {self.cores} core(s) x "
                              f"{self.lanes_per_pair} lane(s) per pair (--interfaces, --cores, --lanes-per-pair) "
                              f"make {lanes} connections per worker, more than {MAX_LANES}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= MAX_PORT:
            raise ConfigError(f"ServerConfig.port (--port) must be 0 (ephemeral) or a port in [1, {MAX_PORT}], "
                              f"got {self.port!r}")
        if self.port and self.port + self.cores - 1 > MAX_PORT:
            raise ConfigError(f"ServerConfig.port (--port) {self.port} with {self.cores} cores (--cores): core "
                              f"{self.cores - 1} would listen on port {self.port + self.cores - 1}, past {MAX_PORT}")
        chunk_elements(self.chunk_bytes)
        object.__setattr__(self, "timeout", check_timeout(self.timeout, "ServerConfig.timeout (--timeout)"))
        object.__setattr__(self, "connect_timeout",
                           check_timeout(self.connect_timeout, "ServerConfig.connect_timeout (--connect-timeout)"))
        if isinstance(self.max_job_bytes, bool) or not isinstance(self.max_job_bytes, int) or \
                not MIN_JOB_BYTES <= self.max_job_bytes <= 1 << 40:
            raise ConfigError(f"ServerConfig.max_job_bytes (--max-job-bytes) must be an integer in "
                              f"[{MIN_JOB_BYTES}, {1 << 40}], got {self.max_job_bytes!r}")
        object.__setattr__(self, "peers", tuple(self.peers))
        for rack, peer in enumerate(self.peers):
            hosts, _ = check_peer(peer)
            if len(hosts) != len(self.interfaces):  # interface i of every rack links to interface i of the others
                raise ConfigError(f"--peers: rack {rack}'s server {peer!r} lists {len(hosts)} interface address(es), "
                                  f"this server has {len(self.interfaces)} (--interfaces); every rack's PBox must "
                                  "have as many, listed as HOST+HOST...:PORT")
        if self.peers and (len(self.peers) < 2 or not 0 <= self.rack < len(self.peers)):
            raise ConfigError(f"ServerConfig: rack {self.rack} with peers {list(self.peers)}: "
                              "give every rack server's address (at least two) and this server's index")
        if self.peers and self.port == 0:
            raise ConfigError("ServerConfig: a rack server needs a fixed --port so the other racks can reach it")
        if isinstance(self.simulated_racks, bool) or not isinstance(self.simulated_racks, int) or \
                not 1 <= self.simulated_racks <= MAX_SIMULATED_RACKS:
            raise ConfigError(f"ServerConfig.simulated_racks (--simulate-racks) must be an integer in "
                              f"[1, {MAX_SIMULATED_RACKS}], got {self.simulated_racks!r}")
        if self.simulated_racks > 1 and self.peers:
            raise ConfigError("ServerConfig: --simulate-racks stands in for racks on one PBox; it does not go "
                              "with --peers (real racks)")
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"ServerConfig.transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        object.__setattr__(self, "rdma_devices", tuple(self.rdma_devices))
        if self.rdma_devices and (self.transport != "verbs" or len(self.rdma_devices) != len(self.interfaces)):
            raise ConfigError(f"ServerConfig.rdma_devices {list(self.rdma_devices)}: give one RDMA port per "
                              f"interface ({len(self.interfaces)}), and only with transport 'verbs'")

    @property
    def racks(self) -> int:
        return len(self.peers) or 1

    @property
    def connect_wait(self) -> float:
        """Seconds a job's workers may take to connect after its first did (and the launcher
        waits for them): the connect timeout, or the timeout if that is shorter."""
        return min(self.connect_timeout, self.timeout)

    def to_argv(self, interfaces: Optional[Tuple[str, ...]] = None) -> List[str]:
        """`phub server` options that recreate this configuration (on other interfaces, if given)."""
        argv = ["--interfaces", ",".join(interfaces or self.interfaces), "--cores", str(self.cores),
                "--port", str(self.port), "--lanes-per-pair", str(self.lanes_per_pair),
                "--chunk-bytes", str(self.chunk_bytes), "--timeout", str(self.timeout)]
        for job in self.jobs:
            argv += ["--job", job.to_option()]
        if self.once:
            argv.append("--once")
        if self.max_job_bytes != DEFAULT_MAX_JOB_BYTES:
            argv += ["--max-job-bytes", str(self.max_job_bytes)]
        if self.connect_timeout != DEFAULT_CONNECT_TIMEOUT:
            argv += ["--connect-timeout", str(self.connect_timeout)]
        if self.report_joins:
            argv.append("--report-joins")
        if self.peers:
            argv += ["--rack", str(self.rack), "--peers", ",".join(self.peers)]
        if self.simulated_racks > 1:
            argv += ["--simulate-racks", str(self.simulated_racks)]
        if self.transport != DEFAULT_TRANSPORT:
            argv += ["--transport", self.transport]
        if self.rdma_devices:
            argv += ["--rdma-devices", ",".join(self.rdma_devices)]
        return argv

    def topology_with(self, shards: int = 1) -> Topology:
        """The topology of a job spread over `shards` servers shaped like this one."""
        return Topology(len(self.interfaces), self.cores, self.lanes_per_pair, shards)
