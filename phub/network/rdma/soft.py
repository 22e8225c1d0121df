"""The "soft-verbs" provider of `phub.network.rdma.fabric`: RC queue pairs in software, on one machine.

A test double that ships with the library: it lets the verbs data path (registration, QP
connection over the TCP handshake, write-with-immediate into the peer's slots, completion
polling, send credits, receive re-posting) run between real processes on a machine without RDMA,
with the semantics the data path relies on:

- a write-with-immediate places `nbytes` at the address the writer named inside a region the
  receiver registered (checked against its rkey and bounds, as a NIC would), then consumes one
  posted receive and completes with the immediate; with no receive posted it waits (RNR retry);
- writes on one queue pair land in the order they were posted;
- every signaled write completes on the sender's completion queue once it has left; an
  unsignaled one never does (`fabric.SendCredits` keeps the accounting);
- nothing blocks: `poll()` moves bytes in both directions and returns what completed.

Transport: each NIC listens on an abstract Unix socket named after its GID (so it reaches the
processes of one network namespace); a queue pair's writes travel on its own stream socket to
the peer NIC, as frames [dest QP, remote address, rkey, immediate, length][payload]. A peer that
disappears makes the next write or poll raise JobFailed, as a retry-exceeded completion would.
Speed is not the point: it is as fast as a Unix socket and a copy.
"""
from __future__ import annotations

import errno
import random
import socket
import struct
from collections import deque
from typing import Dict, List, Optional

from ...errors import ConfigError, JobFailed
from .connect import ConnParams
from .fabric import WC_RDMA_WRITE, WC_RECV_RDMA_WITH_IMM, Completion, Memory, Region, SendCredits, check_write

_NAME = b"\0phub-soft-rdma-"
_HELLO = struct.Struct("<I")  # the destination queue pair of a new stream
_FRAME = struct.Struct("<IQIII")  # dest qp, remote address, rkey, immediate (host order), length
_MTU = 4096


def open_nic(device: Optional[str] = None) -> "SoftNic":
    if device not in (None, "", "soft"):
        raise ConfigError(f"the soft-verbs transport has one device, 'soft'; got {device!r}")
    return SoftNic()


class _Inbound:
    """One stream from a peer queue pair: bytes received, not yet parsed."""

    __slots__ = ("sock", "buffer", "qp")

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.qp = sock, bytearray(), None


class SoftNic:
    nap = 0.0005  # seconds an event loop may sleep between polls (a software NIC raises no interrupt)

    def __init__(self):
        self.lid = 0
        self.mtu = _MTU
        tail = random.getrandbits(48)
        self.gid = "fe80:0000:0000:0000:0000:" + ":".join(f"{tail >> s & 0xFFFF:04x}" for s in (32, 16, 0))
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(_NAME + self.gid.encode())
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.regions: Dict[int, Region] = {}
        self.qps: Dict[int, "SoftConnection"] = {}
        self.inbound: List[_Inbound] = []
        self.completions: deque = deque()
        self.scratch = self.register(Memory(4096))

    def register(self, memory: Memory) -> Region:
        rkey = random.getrandbits(32)
        while rkey in self.regions:
            rkey = random.getrandbits(32)
        region = Region(memory, rkey, rkey)
        self.regions[rkey] = region
        return region

    def connection(self, **options) -> "SoftConnection":
        conn = SoftConnection(self, **options)
        self.qps[conn.qp_num] = conn
        return conn

    def poll(self, max_entries: int = 64) -> List[Completion]:
        self._accept()
        for conn in self.qps.values():
            conn.flush()
        for stream in list(self.inbound):
            self._receive(stream)
        for conn in self.qps.values():
            conn.deliver()
        out = []
        while self.completions and len(out) < max_entries:
            out.append(self.completions.popleft())
        return out

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self.inbound.append(_Inbound(sock))

    def _receive(self, stream: _Inbound) -> None:
        try:
            data = stream.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the peer closed: a queue pair that is gone sends nothing more
            self.inbound.remove(stream)
            stream.sock.close()
            return
        buf = stream.buffer
        buf += data
        at = 0
        if stream.qp is None and len(buf) >= _HELLO.size:
            (qp_num,) = _HELLO.unpack_from(buf)
            stream.qp = self.qps.get(qp_num)
            if stream.qp is None:
                raise JobFailed(f"soft RDMA: a peer connected to queue pair {qp_num}, which this NIC does not have")
            at = _HELLO.size
        while stream.qp is not None and len(buf) - at >= _FRAME.size:
            _, addr, rkey, imm, nbytes = _FRAME.unpack_from(buf, at)
            if len(buf) - at - _FRAME.size < nbytes:
                break
            start = at + _FRAME.size
            stream.qp.arrived.append((addr, rkey, imm, bytes(buf[start:start + nbytes])))
            at = start + nbytes
        del buf[:at]

    def close(self) -> None:
        for conn in self.qps.values():
            if conn.sock is not None:
                conn.sock.close()
        for stream in self.inbound:
            stream.sock.close()
        self.listener.close()


class SoftConnection:
    def __init__(self, nic: SoftNic, *, sq_depth: int = 256, signal_every: int = 64, **_device_options):
        self.nic = nic
        self.credits = SendCredits(sq_depth, signal_every)
        self.qp_num = random.getrandbits(24)
        while self.qp_num in nic.qps:
            self.qp_num = random.getrandbits(24)
        self.psn = random.getrandbits(24)
        self.remote: Optional[ConnParams] = None
        self.sock: Optional[socket.socket] = None
        self.outq: deque = deque()  # [bytes, wr_id or 0 if unsignaled]
        self.receives = 0  # receive requests posted and not yet consumed
        self.arrived: deque = deque()  # writes received, waiting for a receive request

    def local_params(self, region: Region) -> ConnParams:
        nic = self.nic
        return ConnParams(qp_num=self.qp_num, psn=self.psn, lid=nic.lid, gid=nic.gid, mtu=nic.mtu,
                          addr=region.addr, rkey=region.rkey, length=region.length)

    def connect(self, remote: ConnParams) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(_NAME + remote.gid.encode())
        except OSError as exc:
            sock.close()
            raise JobFailed(f"soft RDMA: cannot reach the peer NIC {remote.gid}: {exc} (soft-verbs reaches only "
                            "processes in this network namespace)") from None
        sock.sendall(_HELLO.pack(remote.qp_num))
        sock.setblocking(False)
        self.sock, self.remote = sock, remote

    def post_receives(self, count: int) -> None:
        self.receives += count

    def write_imm(self, region: Region, local_offset: int, nbytes: int, target: ConnParams,
                  remote_offset: int, imm: int) -> bool:
        check_write(self.remote, region, local_offset, nbytes, target, remote_offset)
        wr_id, signaled = self.credits.take()
        head = _FRAME.pack(self.remote.qp_num, target.addr + remote_offset, target.rkey, imm, nbytes)
        self.outq.append([head + region.memory.bytes(local_offset, nbytes), wr_id if signaled else 0])
        self.flush()
        return signaled

    def flush(self) -> None:
        while self.outq:
            item = self.outq[0]
            try:
                sent = self.sock.send(item[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.ECONNRESET):
                    raise JobFailed(f"soft RDMA: the peer of queue pair {self.qp_num} is gone "
                                    "(a write could not be delivered)") from None
                raise
            if sent < len(item[0]):
                item[0] = item[0][sent:]
                return
            self.outq.popleft()
            if item[1]:
                self.nic.completions.append(Completion(item[1], WC_RDMA_WRITE, self.qp_num, 0, None))

    def deliver(self) -> None:
        """Place the writes that have a receive request to consume, in order."""
        while self.arrived and self.receives:
            addr, rkey, imm, data = self.arrived.popleft()
            region = self.nic.regions.get(rkey)
            if region is None:
                raise JobFailed(f"soft RDMA: queue pair {self.qp_num} got a write for rkey {rkey:#x}, "
                                "which no region of this NIC has (remote access error)")
            offset = addr - region.addr
            if offset < 0 or offset + len(data) > region.length:
                raise JobFailed(f"soft RDMA: queue pair {self.qp_num} got a write of {len(data)} bytes at "
                                f"{addr:#x}, outside region {rkey:#x} (remote access error)")
            region.memory.bytes(offset, len(data))[:] = data
            self.receives -= 1
            self.nic.completions.append(Completion(0, WC_RECV_RDMA_WITH_IMM, self.qp_num, len(data), imm))
