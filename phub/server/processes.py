"""The PHub server: one process per core, each serving its lanes on every interface.

`Server.start()` binds every listening socket (core c listens on each interface at `port + c`,
or on ephemeral ports when `port` is 0), then forks one process per core. Core 0 also answers
discovery: a worker's first connection learns the server's interfaces, cores and endpoints.
`Server.wait()` blocks until the cores exit and returns 0 only if every core did; if one core
fails, the others are stopped.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from typing import List, Optional

from ..config import Endpoint, JobSpec, ServerConfig
from .coreloop import Core, _log

__all__ = ["Server", "ServerConfig", "JobSpec"]


def _core_main(config: ServerConfig, core: int, listeners, endpoints) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it terminates us on Ctrl-C
    try:
        status = Core(config, core, listeners, endpoints).run()
    except Exception as exc:  # a bug, not a peer's fault: say so and fail the server
        _log(f"core {core} crashed: {type(exc).__name__}: {exc}")
        raise
    sys.stdout.flush()
    os._exit(status)


class Server:
    """A running PHub server (the cores run in child processes)."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.endpoints: List[List[Endpoint]] = []
        self._processes: List[multiprocessing.Process] = []

    @property
    def address(self) -> str:
        """The discovery address (core 0, first interface) workers pass to `phub.connect`."""
        host, port = self.endpoints[0][0]
        return f"{host}:{port}"

    @property
    def pids(self) -> List[int]:
        """Process ids of the cores."""
        return [p.pid for p in self._processes]

    def start(self) -> "Server":
        """Bind every endpoint and start the cores; OSError names an address that cannot be bound.

        ConfigError (with `phub doctor`'s explanation) if the configured transport cannot run here.
        """
        from ..launching.doctor import require_transport  # probes RDMA only when the verbs transport is asked for

        require_transport(self.config.transport)
        listeners: List[List[socket.socket]] = []
        for core in range(self.config.cores):
            row = []
            for address in self.config.interfaces:
                port = self.config.port + core if self.config.port else 0
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((address, port))
                except OSError as exc:
                    raise OSError(f"cannot listen on {address}:{port}: {exc}") from None
                sock.listen(1024)
                row.append(sock)
            listeners.append(row)
        self.endpoints = [[sock.getsockname()[:2] for sock in row] for row in listeners]
        context = multiprocessing.get_context("fork")
        for core, row in enumerate(listeners):
            process = context.Process(target=_core_main, args=(self.config, core, row, self.endpoints),
                                      name=f"phub-core-{core}", daemon=True)
            process.start()
            self._processes.append(process)
        for row in listeners:
            for sock in row:
                sock.close()
        return self

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Block until every core exits (0 if all succeeded) or `timeout` passes (then None).

        A core that fails makes the others stop at once: the job state is split across cores.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        running = list(self._processes)
        while running:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait([p.sentinel for p in running], timeout=left)
            if not ready:
                return None
            for process in [p for p in running if p.sentinel in ready]:
                process.join()
                running.remove(process)
                if process.exitcode != 0:
                    _log(f"{process.name} exited with status {process.exitcode}; stopping the server")
                    self.stop()
                    return 1
        return 0

    def stop(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
