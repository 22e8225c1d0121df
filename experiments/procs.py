"""Start a system's processes on cluster nodes, supervise them, and always clean them up.

Used by the baselines whose processes phub's launcher does not know (ps-lite's scheduler and
servers, gloo's workers). Every process starts through `node.argv(...)`, in its own session so
that stopping it also stops its children. `ProcessGroup.run` blocks until every worker has exited
0, and raises PHubError naming the first process that failed (a worker exiting non-zero, a
service dying before the workers are done, or the run's deadline passing); leaving the `with`
block stops whatever still runs (SIGTERM, SIGKILL after a grace period).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from phub.cluster import Node
from phub.errors import PHubError
from phub.launch import stop_processes

GRACE = 5.0  # seconds between SIGTERM and SIGKILL when stopping
SERVICE_EXIT = 30.0  # seconds services get to exit on their own once the workers are done
POLL = 0.05  # supervisor polling interval (it only watches exit codes; nothing synchronizes on it)

# Run in a node's context to find a free TCP port on one of its addresses (the node may sit in
# another network namespace, so the parent cannot probe it itself).
_PROBE = ("import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 0)); "
          "print(s.getsockname()[1]); s.close()")


def free_port(node: Node, address: Optional[str] = None) -> int:
    """A TCP port free on `address` (default the node's first) of `node`, probed on the node."""
    address = address or node.addresses[0]
    result = subprocess.run(node.argv([sys.executable, "-c", _PROBE, address]), capture_output=True,
                            text=True, timeout=60)
    if result.returncode != 0:
        raise PHubError(f"could not find a free port on {node.name} ({address}): {result.stderr.strip()}")
    return int(result.stdout.strip())


def _pump(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, b""):
        try:
            sink.write(prefix + line.decode(errors="replace"))
            sink.flush()
        except ValueError:  # the sink was closed: the run is over, drop the rest
            break
    stream.close()


class ProcessGroup:
    """The processes of one run: services (scheduler, servers) and workers."""

    def __init__(self, output=None):
        self.output = output or sys.stderr
        self._services: List[Tuple[str, subprocess.Popen]] = []
        self._workers: List[Tuple[str, subprocess.Popen]] = []

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, who: str, node: Node, argv: Sequence[str], env: Dict[str, str], worker: bool) -> None:
        """Start `argv` on `node` with `env` added to this process's environment."""
        proc = subprocess.Popen(node.argv(argv), env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        (self._workers if worker else self._services).append((who, proc))
        threading.Thread(target=_pump, args=(proc.stdout, f"[{who}] ", self.output), daemon=True).start()

    def run(self, timeout: float) -> None:
        """Block until every worker exited 0, then give the services a while to exit on their own.

        Raises PHubError naming the culprit: a worker that failed, a service that died first, or
        the `timeout` (seconds for the whole run) passing."""
        deadline = time.monotonic() + timeout
        running = list(self._workers)
        while running:
            for who, proc in list(running):
                code = proc.poll()
                if code is None:
                    continue
                running.remove((who, proc))
                if code != 0:
                    raise PHubError(f"{who} exited with status {code}; see its output above")
            for who, proc in self._services:
                # A service may finish (status 0) just before the last worker does: ps-lite's
                # shut down as soon as every node has said goodbye. Only a failure counts.
                code = proc.poll()
                if code not in (None, 0):
                    raise PHubError(f"{who} failed (status {code}) while the workers were running")
            if time.monotonic() > deadline:
                raise PHubError(f"the run did not finish within {timeout:g} s; still running: "
                                f"{', '.join(who for who, _ in running)}")
            time.sleep(POLL)
        end = time.monotonic() + SERVICE_EXIT
        for who, proc in self._services:
            try:
                code = proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise PHubError(f"{who} did not exit within {SERVICE_EXIT:g} s after the workers") from None
            if code != 0:
                raise PHubError(f"{who} did not finish cleanly (status {code})")

    def stop(self) -> None:
        """SIGTERM every process group still running; SIGKILL what is left after GRACE seconds."""
        stop_processes([proc for _, proc in self._services + self._workers], GRACE)
