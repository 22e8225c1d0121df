"""Connection parameters of an RC queue pair, exchanged over the TCP control channel.

Two RC queue pairs can talk only once each knows the other's queue pair number, first packet
sequence number and address (LID on InfiniBand, GID on RoCE), and a side can write into the
other's memory only with that memory's base address and remote key. phub sends these on the
lane's TCP connection, inside the handshake it already has: as a documented extension of the
HELLO and WELCOME frames of `phub/wire.py` (no new frame kind):

    worker -> server  HELLO   {..., "rdma": PARAMS}   its QP, and its results region (the server
                                                     writes new weights there)
    server -> worker  WELCOME {..., "rdma": PARAMS}   the QP made for this connection, and the
                                                     (core, NIC) region holding the worker's slots

    PARAMS = {"qp_num": int < 2**24, "psn": int < 2**24, "lid": int < 2**16,
              "gid": "xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx", "mtu": 256|512|1024|2048|4096,
              "addr": int < 2**64, "rkey": int < 2**32, "length": int >= 1}

A peer that sends anything else (a missing or extra field, a wrong type, a value out of range)
is answered with an ERROR frame naming the field, as the TCP server answers any bad frame.

`worker_handshake` and `server_handshake` do the exchange on a blocking socket (one connection at
a time); the server's event loop would call `attach`/`extract` on the frames it already handles.
"""
from __future__ import annotations

import re
import socket
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Tuple

from .. import wire
from ..errors import JobFailed, PHubTimeout, ProtocolError

FIELD = "rdma"  # the key of the extension in HELLO and WELCOME bodies
MTUS = (256, 512, 1024, 2048, 4096)
ZERO_GID = ":".join(["0000"] * 8)
_GID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")
_LIMITS = {"qp_num": 1 << 24, "psn": 1 << 24, "lid": 1 << 16, "addr": 1 << 64, "rkey": 1 << 32,
           "length": 1 << 64}


@dataclass(frozen=True)
class ConnParams:
    """What one side of an RC connection tells the other. Construction validates (ProtocolError)."""

    qp_num: int  # the sender's queue pair number (24 bits)
    psn: int  # the first packet sequence number the sender will use (24 bits)
    lid: int  # the sender port's LID (InfiniBand); 0 on RoCE
    gid: str  # the sender port's GID; all zeros when the fabric routes by LID only
    mtu: int  # the sender port's active MTU in bytes; both sides use the smaller one
    addr: int  # base virtual address of the region the peer may write into
    rkey: int  # remote key of that region
    length: int  # bytes in that region

    def __post_init__(self):
        for name, limit in _LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProtocolError(f"rdma.{name} must be an integer, got {value!r}")
            if not 0 <= value < limit:
                raise ProtocolError(f"rdma.{name} = {value} is outside [0, {limit})")
        if self.length < 1 or self.addr + self.length > 1 << 64:
            raise ProtocolError(f"rdma region [{self.addr:#x}, +{self.length}) is empty or wraps around")
        if not isinstance(self.gid, str) or not _GID.match(self.gid):
            raise ProtocolError(f"rdma.gid must be 8 colon-separated groups of 4 lowercase hex digits, got {self.gid!r}")
        if not isinstance(self.mtu, int) or isinstance(self.mtu, bool) or self.mtu not in MTUS:
            raise ProtocolError(f"rdma.mtu must be one of {MTUS}, got {self.mtu!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj, who: str = "the peer") -> "ConnParams":
        """Parse the PARAMS object; ProtocolError names `who` and the offending field."""
        if not isinstance(obj, dict):
            raise ProtocolError(f"{who} sent rdma parameters that are not a JSON object: {obj!r:.80}")
        expected = set(cls.__dataclass_fields__)
        missing, extra = sorted(expected - set(obj)), sorted(set(obj) - expected)
        if missing:
            raise ProtocolError(f"{who} sent rdma parameters without {', '.join(missing)}")
        if extra:
            raise ProtocolError(f"{who} sent unknown rdma parameters {', '.join(map(str, extra))}")
        try:
            return cls(**obj)
        except ProtocolError as exc:
            raise ProtocolError(f"{who} sent bad rdma parameters: {exc}") from None

    def check_covers(self, nbytes: int, who: str = "the peer") -> None:
        """ProtocolError unless the advertised region has at least `nbytes` (what the plan needs)."""
        if self.length < nbytes:
            raise ProtocolError(f"{who} registered {self.length} bytes, the plan needs {nbytes}: "
                                "the two sides disagree about the registered arrays")


def path_mtu(local: ConnParams, remote: ConnParams) -> int:
    """The MTU both ports support (bytes)."""
    return min(local.mtu, remote.mtu)


def attach(body: dict, params: ConnParams) -> dict:
    """A copy of a HELLO/WELCOME body carrying `params`."""
    return dict(body, **{FIELD: params.to_json()})


def extract(body: dict, who: str = "the peer") -> ConnParams:
    """The parameters in a HELLO/WELCOME body; ProtocolError if absent or malformed."""
    if FIELD not in body:
        raise ProtocolError(f"{who} did not send rdma parameters (the server runs the verbs transport)")
    return ConnParams.from_json(body[FIELD], who)


# -- blocking exchange on one socket -----------------------------------------------------------
def _reject_data(header: wire.Header) -> memoryview:
    raise ProtocolError(f"expected a control frame during the rdma handshake, got {header.kind.name}")


def recv_control(sock: socket.socket, timeout: float) -> wire.Frame:
    """Block until one whole control frame arrives; PHubTimeout after `timeout` seconds.

    Raises ProtocolError for a bad frame or a data frame, and if the peer closes first.
    """
    receiver = wire.FrameReceiver(_reject_data)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PHubTimeout(f"no handshake frame within {timeout} s")
        sock.settimeout(left)
        try:
            n = sock.recv_into(receiver.buffer())
        except socket.timeout:
            raise PHubTimeout(f"no handshake frame within {timeout} s") from None
        if n == 0:
            raise ProtocolError("the peer closed the connection during the rdma handshake")
        frame = receiver.received(n)
        if frame is not None:
            return frame


def _error_message(frame: wire.Frame) -> str:
    try:
        return str(frame.json().get("message", ""))
    except ProtocolError:
        return "(unreadable error message)"


def worker_handshake(sock: socket.socket, hello: dict, local: ConnParams, *, job: int, rank: int,
                     timeout: float = 30.0) -> Tuple[dict, ConnParams]:
    """Send HELLO with `local`; return the server's WELCOME body and its parameters.

    Blocks up to `timeout` seconds. Raises JobFailed if the server answers ERROR (its message),
    ProtocolError if the answer is not a well-formed WELCOME with parameters, PHubTimeout.
    """
    sock.sendall(wire.control_frame(wire.Kind.HELLO, job, rank, attach(hello, local)))
    frame = recv_control(sock, timeout)
    if frame.header.kind is wire.Kind.ERROR:
        raise JobFailed(f"the server refused the rdma handshake: {_error_message(frame)}")
    if frame.header.kind is not wire.Kind.WELCOME:
        raise ProtocolError(f"expected WELCOME, got {frame.header.kind.name}")
    body = frame.json()
    return body, extract(body, "the server")


Answer = Callable[[dict, ConnParams], Tuple[dict, ConnParams]]


def server_handshake(sock: socket.socket, answer: Answer, *, timeout: float = 30.0,
                     job: Optional[int] = None) -> Tuple[dict, ConnParams]:
    """Receive a worker's HELLO, call `answer(hello, worker_params)`, send WELCOME with its result.

    `answer` returns (welcome body, this side's parameters): it is where the server creates the
    connection's queue pair. Returns (hello body, worker parameters). A malformed HELLO (or one
    for another job than `job`) is answered with an ERROR frame naming the problem, then
    ProtocolError is raised; blocks up to `timeout` seconds for the HELLO.
    """
    frame = recv_control(sock, timeout)
    header = frame.header
    try:
        if header.kind is not wire.Kind.HELLO:
            raise ProtocolError(f"expected HELLO, got {header.kind.name}")
        if job is not None and header.job != job:
            raise ProtocolError(f"HELLO for job {header.job}, this server runs job {job}")
        hello = frame.json()
        remote = extract(hello, f"rank {header.sender}")
    except ProtocolError as exc:
        error = wire.control_frame(wire.Kind.ERROR, header.job, wire.SERVER_SENDER, {"message": str(exc)})
        try:
            sock.sendall(error)
        except OSError:
            pass  # the peer is gone; the error below says what was wrong
        raise
    welcome, local = answer(hello, remote)
    sock.sendall(wire.control_frame(wire.Kind.WELCOME, header.job, wire.SERVER_SENDER, attach(welcome, local)))
    return hello, remote
