"""Run one of a job's processes on a node reached by a remote shell (`python -m phub.launching.remote`).

A remote shell (`ssh HOST`) passes no environment and, once the launcher stops, leaves what it
started running. So the launcher starts this module there instead of the command itself, and
writes one JSON line to its stdin: {"argv": [...], "env": {...}, "cwd": "..."}. It starts the
command with that environment added, in that directory, in a session of its own, and stops it
(SIGTERM, SIGKILL after GRACE seconds) when its own stdin closes (the launcher or its remote
shell went away) or it is sent SIGTERM, SIGHUP or SIGINT. It exits as the command did: with its
status, or killed by the same signal. The environment travels on stdin, not on the command line,
so that no job token shows in the node's process list.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

GRACE = 5.0


def request_line(argv, env, cwd) -> bytes:
    """The line the launcher writes to this module's stdin."""
    return json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode() + b"\n"


def _stop(child: subprocess.Popen) -> None:
    """SIGTERM the command's session, SIGKILL it if it still runs after GRACE seconds."""
    for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main() -> int:
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: what follows the line is the watcher's
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    try:
        request = json.loads(line)
        argv, env, cwd = list(request["argv"]), dict(request["env"]), request["cwd"]
    except (ValueError, KeyError, TypeError):
        print(f"phub.launching.remote: expected a JSON request line on stdin, got {line[:200]!r}", file=sys.stderr)
        return 2
    try:
        child = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    except OSError as exc:
        print(f"phub.launching.remote: cannot start {argv[:1]} in {cwd} on {os.uname().nodename}: {exc}",
              file=sys.stderr, flush=True)
        return 127

    def stop_on_signal(signum, frame):
        threading.Thread(target=_stop, args=(child,), daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop_on_signal)

    def stop_on_eof():
        while os.read(0, 4096):  # returns b"" when the launcher's end of the pipe closes
            pass
        _stop(child)

    threading.Thread(target=stop_on_eof, daemon=True).start()
    code = child.wait()
    if code < 0:  # die of the same signal, so that the launcher names it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not sys.exit: the thread that watches stdin may still be reading it
