"""Start a PHub job on this machine: the server cores plus N copies of a worker command.

`run_job` is what `phub launch` and `phub bench` use. It blocks until the job ends: every worker
exited 0 (returns 0), or one failed; then the rest are stopped within a bounded time and the
status says who failed first.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .client import ENV_JOB, ENV_RANK, ENV_SERVER, ENV_TIMEOUT, ENV_TOKEN, ENV_WORKERS
from .server import Server, ServerConfig

_GRACE = 5.0  # seconds a stopped process gets between SIGTERM and SIGKILL


@dataclass
class JobResult:
    status: int
    failed: Optional[str] = None  # who failed first, in words
    worker_status: Dict[int, Optional[int]] = field(default_factory=dict)


def worker_env(server: Server, rank: int, num_workers: int, job_id: int = 0, token: str = "",
               timeout: Optional[float] = None) -> Dict[str, str]:
    """The environment variables `phub.connect()` reads."""
    env = {ENV_SERVER: server.address, ENV_RANK: str(rank), ENV_WORKERS: str(num_workers),
           ENV_JOB: str(job_id), ENV_TOKEN: token}
    if timeout is not None:
        env[ENV_TIMEOUT] = str(timeout)
    return env


def _pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, b""):
        sink.buffer.write(prefix.encode() + line)
        sink.flush()
    stream.close()


def _stop(processes: Sequence[subprocess.Popen]) -> None:
    """SIGTERM every process group still running, then SIGKILL what is left after a grace period."""
    for proc in processes:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + _GRACE
    for proc in processes:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def run_job(command: Sequence[str], num_workers: int, config: Optional[ServerConfig] = None,
            extra_env: Optional[Dict[str, str]] = None, prefix_output: bool = True,
            stdout=None, stderr=None) -> JobResult:
    """Start a server for one job and `num_workers` copies of `command`; block until all end.

    Worker output is streamed line by line with a `[rank R]` prefix. If a worker exits non-zero,
    or a server core fails, every other process is stopped (SIGTERM, then SIGKILL after 5 s).
    """
    from .server import JobSpec

    config = config or ServerConfig(jobs=(JobSpec(0, num_workers),), once=True)
    spec = config.jobs[0]
    server = Server(config).start()
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    processes: List[subprocess.Popen] = []
    pumps: List[threading.Thread] = []
    result = JobResult(0)
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM,)}
    try:
        for rank in range(num_workers):
            env = dict(os.environ, **(extra_env or {}),
                       **worker_env(server, rank, num_workers, spec.job_id, spec.token, config.timeout))
            proc = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            processes.append(proc)
            tag = f"[rank {rank}] " if prefix_output else ""
            for stream, sink in ((proc.stdout, stdout), (proc.stderr, stderr)):
                pump = threading.Thread(target=_pump, args=(stream, tag, sink), daemon=True)
                pump.start()
                pumps.append(pump)
        running = dict(enumerate(processes))
        while running and result.status == 0:
            for rank, proc in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[rank]
                result.worker_status[rank] = code
                if code != 0:
                    result.status, result.failed = 1, f"rank {rank} exited with status {code}"
            if result.status == 0 and running:
                server_status = server.wait(timeout=0.05)
                if server_status not in (None, 0):
                    result.status, result.failed = 1, "the phub server failed"
        if result.status == 0:
            server_status = server.wait(timeout=30.0)
            if server_status != 0:
                result.status = 1
                result.failed = "the phub server did not finish cleanly" if server_status else \
                    "the phub server did not exit within 30 s after the workers"
    except KeyboardInterrupt:
        result.status, result.failed = 130, "interrupted"
    finally:
        _stop(processes)
        server.stop()
        for pump in pumps:
            pump.join(2.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for rank, proc in enumerate(processes):
        result.worker_status.setdefault(rank, proc.returncode)
    return result
