"""How a worker leaves its job when the script ends without `close()`.

Most training scripts never close their kvstore: they end, or call `sys.exit(0)`. As with
torchrun or Horovod, a worker process that ends normally has succeeded, so every `Client` still
open in the process says goodbye at interpreter exit (an `atexit` hook, registered with the
first client):

- the script ended, or raised `SystemExit` (any status): the client waits for its pushpulls in
  flight (at most its `timeout`) and says BYE on every lane, exactly as `close()` does. A job
  whose workers all said BYE ends with status 0. If the work in flight does not finish in time,
  the client tells the server it gives up instead (ERROR), and the job fails naming the rank;
- the script died of an uncaught exception (outside an interactive session): the client tells
  the server at once that this rank gave up, naming the exception, without waiting;
- a process killed by a signal says nothing: the server sees its connections close and fails
  the job naming the worker.

A forked child never touches its parent's clients (they belong to the parent's I/O threads).
Objects of the integrations that opened their own client (the MXNet kvstore, ServerOptimizer)
also close it when they are garbage-collected (`close_when_collected`). A `Client` itself stays
open until closed or the interpreter exits: its I/O thread holds it.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import List, Optional

from ..errors import PHubError

_open: "weakref.WeakSet" = weakref.WeakSet()  # clients of this process not yet closed
_uncaught: List[str] = []  # the uncaught exceptions the interpreter reported, in words
_installed = False
_install_lock = threading.Lock()


def track(client) -> None:
    """Close `client` at interpreter exit if it is still open then (see the module docstring)."""
    global _installed
    with _install_lock:
        if not _installed:
            _installed = True
            atexit.register(_at_exit)
            sys.excepthook = _recording(sys.excepthook)
        _open.add(client)


def _recording(previous):
    def excepthook(kind, value, traceback):
        _uncaught.append(f"{kind.__name__}: {value}"[:300])
        previous(kind, value, traceback)
    return excepthook


def _crash() -> Optional[str]:
    """The uncaught exception that is ending this interpreter, if any. In an interactive session
    every error at the prompt goes through the excepthook too, so none counts there."""
    if not _uncaught or hasattr(sys, "ps1") or sys.flags.interactive:
        return None
    return _uncaught[-1]


def _at_exit() -> None:
    crash = _crash()
    for client in list(_open):
        goodbye(client, f"rank {client.rank} exited on an uncaught {crash}" if crash else None)


def goodbye(client, abort: Optional[str] = None) -> None:
    """Close `client` without raising: BYE after its work in flight, or, with `abort`, tell the
    server this rank gives up. Does nothing in another process than the client's, or on the
    client's own I/O thread (a garbage collection that ran there: exit closes it later)."""
    if client._pid != os.getpid() or threading.current_thread() is client._thread:
        return
    try:
        client.close(abort=abort)
    except PHubError as exc:
        print(f"phub: rank {client.rank} could not leave its job cleanly: {exc}", file=sys.stderr, flush=True)


def made_a_client() -> bool:
    """Whether this process has opened a `Client` (connected to a server) at all."""
    return _installed


def closed(client) -> None:
    """`client` was closed: nothing is left to do for it at exit."""
    _open.discard(client)


def close_when_collected(owner, client) -> weakref.finalize:
    """Close `client` (opened by `owner`) when `owner` is garbage-collected. At interpreter exit
    the exit hook closes it instead, so that a crash is reported as one."""
    finalizer = weakref.finalize(owner, goodbye, client)
    finalizer.atexit = False
    return finalizer
