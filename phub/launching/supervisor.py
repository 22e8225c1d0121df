"""Start a run's processes, pump their output with a prefix, watch them, and stop them all.

The one process supervisor: `phub launch` (through `phub.launching.launch.run_job`) and the experiments'
baselines (ps-lite's scheduler and servers, gloo's ranks) start every process through it. A
process is a *worker* (the run is done when every worker has exited 0) or a *service* (it serves
the workers: a phub server, ps-lite's scheduler). Every process leads its own session, so that
stopping it also stops its children; leaving the `with` block stops whatever still runs
(SIGTERM, then SIGKILL after a grace period).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import PHubError

GRACE = 5.0  # seconds a stopped process gets between SIGTERM and SIGKILL
SERVICE_EXIT = 30.0  # seconds services get to exit on their own once the workers are done
POLL = 0.05  # polling interval: the supervisor only watches exit codes; nothing synchronizes on it


def pump(stream, prefix: str, sink, last: Optional[Callable[[str], None]] = None) -> None:
    """Copy `stream`'s lines to `sink`, each after `prefix`, until EOF or `sink` closes. A sink
    with a byte buffer (sys.stdout) gets the bytes unchanged; any other text stream decoded text.
    `last` is told each line that is not blank (without its end), as text."""
    raw = getattr(sink, "buffer", None)
    for line in iter(stream.readline, b""):
        if last is not None and line.strip():
            last(line.decode(errors="replace").rstrip())
        try:
            if raw is not None:
                raw.write(prefix.encode() + line)
            else:
                sink.write(prefix + line.decode(errors="replace"))
            sink.flush()
        except ValueError:  # the sink was closed: the run is over, drop the rest
            break
    stream.close()


def stop_processes(processes: Sequence[subprocess.Popen], grace: float = GRACE) -> None:
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


def exit_status(code: int) -> str:
    """`status 1`, or `status -9 (SIGKILL)` for a process a signal ended."""
    if code < 0 and -code in signal.valid_signals():
        return f"status {code} ({signal.Signals(-code).name})"
    return f"status {code}"


def first_failed(failed: Sequence[Tuple[str, int]]) -> Tuple[str, int]:
    """Of the (name, exit code) of the workers that failed in one poll (in start order), the one
    whose failure came first: one killed by a signal over one that exited with an error, as the
    others exit when told a worker was lost."""
    return min(failed, key=lambda item: item[1] > 0)


def blame(failed: Sequence[Tuple[str, int]]) -> str:
    """Name the worker whose failure came first among those seen in one poll (`first_failed`)."""
    name, code = first_failed(failed)
    others = [other for other, _ in failed if other != name]
    return f"{name} exited with {exit_status(code)}" + (f"; {', '.join(others)} failed with it" if others else "")


class Supervisor:
    """The processes of one run. Not thread-safe: one thread starts and watches them."""

    def __init__(self):
        self._services: List[Tuple[str, subprocess.Popen]] = []
        self._workers: List[Tuple[str, subprocess.Popen]] = []
        self.worker_status: Dict[str, int] = {}  # exit status of each worker seen exiting
        self.failed_service: Optional[str] = None  # the service whose failure ended `wait_workers`
        self.failed_worker: Optional[str] = None  # the worker `blame` named when one ended `wait_workers`
        self.last_lines: Dict[str, str] = {}  # each process's last line of output (its stderr, if apart)
        self._processes: Dict[str, subprocess.Popen] = {}
        self._pumps: List[threading.Thread] = []
        self._pumps_of: Dict[str, List[threading.Thread]] = {}

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, name: str, argv: Sequence[str], *, service: bool = False, env: Optional[Dict[str, str]] = None,
              output=None, stdout=None, prefix: Optional[str] = None,
              stdin: Optional[bytes] = None) -> subprocess.Popen:
        """Start `argv` (`env`: this process's environment plus these) in a session of its own; does
        not block. Its stderr lines go to `output` after `prefix` (default `[NAME] `), its stdout
        lines to `stdout`, or to `output` too when `stdout` is None, or stay unread for the caller
        when `stdout` is subprocess.PIPE. `stdin`: bytes written to its stdin, which then stays
        open until the process is stopped (else it reads nothing)."""
        prefix = f"[{name}] " if prefix is None else prefix
        merged = stdout is None
        proc = subprocess.Popen(list(argv), env=dict(os.environ, **(env or {})),
                                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                                start_new_session=True)
        if stdin is not None:
            try:
                proc.stdin.write(stdin)
                proc.stdin.flush()
            except BrokenPipeError:  # it exited at once: its status says why
                pass
        (self._services if service else self._workers).append((name, proc))
        self._processes[name] = proc
        if output is not None:
            self._pump(name, proc.stdout if merged else proc.stderr, prefix, output,
                       lambda line: self.last_lines.__setitem__(name, line))
        if not merged and stdout is not subprocess.PIPE:
            self._pump(name, proc.stdout, prefix, stdout)
        return proc

    def _pump(self, name: str, stream, prefix: str, sink, last=None) -> None:
        thread = threading.Thread(target=pump, args=(stream, prefix, sink, last), daemon=True)
        thread.start()
        self._pumps.append(thread)
        self._pumps_of.setdefault(name, []).append(thread)

    def settle(self, name: str, wait: float) -> Optional[int]:
        """Wait up to `wait` seconds for process `name` to exit and its output to be pumped (so
        that `last_lines` holds its last words); its exit status, or None if it still runs."""
        end = time.monotonic() + wait
        try:
            code = self._processes[name].wait(wait)
        except subprocess.TimeoutExpired:
            return None
        for thread in self._pumps_of.get(name, ()):
            thread.join(max(0.0, end - time.monotonic()))
        return code

    def wait_workers(self, time_limit: Optional[float] = None,
                     check: Optional[Callable[[], Optional[str]]] = None) -> Optional[str]:
        """Block until every worker has exited 0 (returns None) or the run fails; returns then, in
        words, who failed first: a worker exiting non-zero (see `blame`), a service failing while
        workers run (a service exiting 0 is no failure: ps-lite's shut down once every node said
        goodbye), `check()` returning a reason (called every poll), or `time_limit` seconds passing."""
        end_by = None if time_limit is None else time.monotonic() + time_limit
        running = list(self._workers)
        while running:
            failed = []
            for name, proc in list(running):
                code = proc.poll()
                if code is not None:
                    running.remove((name, proc))
                    self.worker_status[name] = code
                    if code != 0:
                        failed.append((name, code))
            if failed:
                self.failed_worker = first_failed(failed)[0]
                return blame(failed)
            if not running:  # all done: a service's status is `wait_services`' business now
                break
            for name, proc in self._services:
                code = proc.poll()
                if code not in (None, 0):
                    self.failed_service = name
                    return f"{name} failed (status {code}) while the workers were running"
            reason = check() if check else None
            if reason:
                return reason
            if end_by is not None and time.monotonic() > end_by:
                return (f"the run did not finish within its time limit of {time_limit:g} s; still running: "
                        f"{', '.join(name for name, _ in running)}")
            time.sleep(POLL)
        return None

    def wait_services(self, grace: float = SERVICE_EXIT) -> Optional[str]:
        """Once the workers are done: block until every service has exited, at most `grace`
        seconds; None when all exited 0, else who did not."""
        end = time.monotonic() + grace
        for name, proc in self._services:
            try:
                code = proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                return f"{name} did not exit within {grace:g} s after the workers"
            if code != 0:
                return f"{name} did not finish cleanly (status {code})"
        return None

    def run(self, time_limit: Optional[float] = None) -> None:
        """`wait_workers`, then `wait_services`; raises PHubError with the first failure."""
        failure = self.wait_workers(time_limit) or self.wait_services()
        if failure:
            raise PHubError(f"{failure}; see its output above")

    def stop(self, grace: float = GRACE) -> None:
        """SIGTERM every process group still running, SIGKILL what is left after `grace` seconds;
        then wait (at most `grace` seconds more) until their output has all been pumped."""
        stop_processes([proc for _, proc in self._services + self._workers], grace)
        for _, proc in self._services + self._workers:
            if proc.stdin is not None:  # a remote node's wrapper stops its command when this closes
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        end = time.monotonic() + grace
        for thread in self._pumps:
            thread.join(max(0.0, end - time.monotonic()))
