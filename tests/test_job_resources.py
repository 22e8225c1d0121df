"""What a job holds on a server core is bounded and given back when the job ends, whatever its
members do: a live server on loopback, members that speak the wire protocol from raw sockets
and misbehave, and the core's resident memory read from /proc."""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from phub.protocol import wire
from phub.network.links import recv_control

K = wire.Kind
REGISTERED = 1 << 19  # floats: 2 MiB of weights, so a STATE_REQUEST's answer is 2 MiB of copies
STATE_REQUESTS = 40  # 80 MiB of answers: more than the bound (twice what the job holds, plus 32 MiB)
SHARED = (("a", 256 * 1024), ("b", 256 * 1024))  # name, characters


def core_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class Server:
    """`phub server` in a process of its own (not forked from this one, whose threads it would
    inherit), serving jobs 0..jobs-1 of one worker each; its core's pid from its ready line."""

    def __init__(self, jobs: int):
        argv = [sys.executable, "-m", "phub", "server", "--timeout", "60"]
        for job in range(jobs):
            argv += ["--job", f"{job}:1"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.address, [self.core_pid] = ready["address"], ready["pids"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def member(server, job: int) -> socket.socket:
    """Rank 0 of `job` (a job of one worker): admitted, 2 MiB registered, two values shared."""
    host, port = server.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(wire.control_frame(K.HELLO, job, 0, {"job": job, "token": "", "rank": 0, "num_workers": 1,
                                                      "lane": 0}))
    assert recv_control(sock, 30).header.kind is K.WELCOME
    frames = [wire.control_frame(K.REGISTER, job, 0, {"batch": 0, "arrays": [["w", REGISTERED]]})]
    frames += [wire.control_frame(K.SHARE, job, 0, {"name": name, "value": "x" * n}) for name, n in SHARED]
    sock.sendall(b"".join(frames))
    return sock


def read_until_closed(sock: socket.socket, seconds: float = 30.0) -> bool:
    """Read and drop everything until the server closes the connection (True) or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(1 << 20):
                return True
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True
    return False


def does_not_read(server, job: int, probe: int) -> None:
    """Asks for its optimizer state again and again without reading the answers: the server
    drops it once more than the bound waits for it, and the job fails."""
    sock = member(server, job)
    sock.sendall(wire.control_frame(K.STATE_REQUEST, job, 0, {}) * STATE_REQUESTS)
    try:
        # before reading a byte: once the core answers the probe it has read every request and
        # queued their answers (reading while it queues could keep the queue under the bound)
        settled(server, probe)
        assert read_until_closed(sock), f"job {job}: the server kept a member that does not read"
    finally:
        sock.close()


def leaves_with_a_queue(server, job: int, probe: int) -> None:
    """Has answers waiting for it (less than the bound) and resets its connection."""
    sock = member(server, job)
    sock.sendall(wire.control_frame(K.STATE_REQUEST, job, 0, {}) * 8)
    settled(server, probe)  # the core has queued the answers
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close = reset
    sock.close()


def settled(server, job: int) -> None:
    """A discovery round trip to the core: once it answers, it has handled every earlier event
    (the loss of the previous member came before this connection was even accepted)."""
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(wire.control_frame(K.HELLO, job, 0, {"job": job, "token": "", "rank": 0, "num_workers": 1,
                                                          "lane": -1}))
        assert recv_control(sock, 30).header.kind is K.WELCOME


def test_memory_after_jobs_with_misbehaving_members_returns_to_where_it_was():
    """Twelve jobs in a row, each with a member that does not read (80 MiB asked for) or that
    leaves with 16 MiB of answers queued, each holding 2.5 MiB of arrays and shared values: the
    core's memory after the last is within a few MB of what it was after the first two."""
    jobs = 12
    server = Server(jobs + 1)
    try:
        pid = server.core_pid
        rss = []
        for job in range(jobs):
            if job % 2 == 0:
                does_not_read(server, job, probe=jobs)
            else:
                leaves_with_a_queue(server, job, probe=jobs)
            settled(server, jobs)
            rss.append(core_rss_bytes(pid))
        grown = rss[-1] - rss[1]
        assert grown < 16 << 20, f"the core grew by {grown / 2**20:.0f} MiB over {jobs - 2} jobs: {rss}"
    finally:
        server.stop()
