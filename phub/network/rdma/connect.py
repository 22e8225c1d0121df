"""Connection parameters of an RC queue pair, exchanged over the TCP control channel.

Two RC queue pairs can talk only once each knows the other's queue pair number, first packet
sequence number and address (LID on InfiniBand, GID on RoCE), and a side can write into the
other's memory only with that memory's base address and remote key. phub sends these on the
lane's TCP connection, inside the frames it already has: as a documented extension of the HELLO,
WELCOME, REGISTER and READY frames of `phub/protocol/wire.py` (no new frame kind):

    worker -> server  HELLO    {..., "rdma": PARAMS}  its QP (the region: a placeholder page)
    server -> worker  WELCOME  {..., "rdma": PARAMS}  the QP made for this connection
    worker -> server  REGISTER {..., "rdma": PARAMS}  its region for the batch (results written there)
    server -> worker  READY    {..., "rdma": PARAMS}  the (core, NIC) region holding its slots

    PARAMS = {"qp_num": int < 2**24, "psn": int < 2**24, "lid": int < 2**16,
              "gid": "xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx", "mtu": 256|512|1024|2048|4096,
              "addr": int < 2**64, "rkey": int < 2**32, "length": int >= 1}

A peer that sends anything else (a missing or extra field, a wrong type, a value out of range)
is answered with an ERROR frame naming the field, as the TCP server answers any bad frame.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ...errors import ProtocolError

FIELD = "rdma"  # the key of the extension in the frames' JSON bodies
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
    """The parameters in a frame's JSON body; ProtocolError if absent or malformed."""
    if FIELD not in body:
        raise ProtocolError(f"{who} did not send rdma parameters (the server runs the verbs transport)")
    return ConnParams.from_json(body[FIELD], who)
