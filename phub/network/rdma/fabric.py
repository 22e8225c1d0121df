"""What the verbs data path needs from an RDMA provider, and the logic it shares across providers.

Two providers implement one small interface (a registry picks one by transport name):

    transport "verbs"       `phub.network.rdma.verbs`: real queue pairs through pyverbs (needs a device)
    transport "soft-verbs"  `phub.network.rdma.soft`: the same operations in software, between processes
                            of one machine (the test double: it runs the whole data path here)

    nic = open_nic(transport, device)     one device port: protection domain + completion queue
    region = nic.register(memory)         one memory region (`Region`: addr, rkey, lkey)
    conn = nic.connection()               one RC queue pair (its `credits`, a `SendCredits`)
    conn.local_params(region) -> ConnParams     what the peer needs (see `connect.py`)
    conn.connect(remote)                  INIT -> RTR -> RTS towards the peer's queue pair
    conn.post_receives(n)                 n receive requests (a write-with-immediate takes one)
    conn.write_imm(region, local_offset, nbytes, target, remote_offset, imm) -> signaled?
    nic.poll(max_entries) -> [Completion] never blocks; JobFailed if a work request failed
    nic.nap                               seconds an event loop may sleep between polls
    nic.close()

Everything above the provider is shared and provider-blind: `Memory` (registered bytes),
`SendCredits` (unsignaled sends with a periodic signaled one), `Writer` (a queue pair's writes,
held back while its send queue is full) and `drain` (one poll: retire sends, re-post receives,
hand back the writes that landed).
"""
from __future__ import annotations

import ctypes
import importlib
import mmap
from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from ...errors import ConfigError, ProtocolError

# Work completion opcodes of <infiniband/verbs.h> (ibv_wc_opcode); receive opcodes have bit 7 set.
WC_RDMA_WRITE = 1
WC_RECV_RDMA_WITH_IMM = 129
PROVIDERS = {"verbs": "phub.network.rdma.verbs", "soft-verbs": "phub.network.rdma.soft"}
RECEIVE_DEPTH = 1024  # receive requests kept posted per queue pair


def open_nic(transport: str, device: Optional[str] = None):
    """Open one port of `transport`'s provider (`device`: "NAME[:PORT]"; None: the first usable).

    ConfigError for an unknown transport or a device that cannot be used (the sentence says why).
    """
    if transport not in PROVIDERS:
        raise ConfigError(f"no RDMA provider for transport {transport!r} (known: {', '.join(PROVIDERS)})")
    return importlib.import_module(PROVIDERS[transport]).open_nic(device)


class Memory:
    """Zeroed, page-aligned anonymous memory: one registered region.

    The bytes stay at one address for the object's life (registration pins them there).
    """

    def __init__(self, length: int):
        if not isinstance(length, int) or length < 1:
            raise ConfigError(f"a registered region needs at least one byte, got {length!r}")
        self.length = length
        self._map = mmap.mmap(-1, length)  # anonymous mappings start on a page boundary
        self._anchor = ctypes.c_char.from_buffer(self._map)  # keeps the mapping exported, so it stays put
        self.address = ctypes.addressof(self._anchor)

    def floats(self, offset: int, count: int) -> np.ndarray:
        """A float32 view of `count` values at byte `offset` (ValueError if out of range)."""
        if offset < 0 or offset % 4 or offset + 4 * count > self.length:
            raise ValueError(f"[{offset}, +{4 * count}) is not a float32 span of this {self.length}-byte region")
        return np.frombuffer(self._map, dtype=np.float32, count=count, offset=offset)

    def bytes(self, offset: int, nbytes: int) -> memoryview:
        """A writable byte view of [offset, offset + nbytes) (ValueError if out of range)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.length:
            raise ValueError(f"[{offset}, +{nbytes}) is outside this {self.length}-byte region")
        return memoryview(self._map)[offset:offset + nbytes]

    def close(self) -> None:
        """Release the memory; only after every MR over it is closed and every view dropped
        (BufferError names a view still alive)."""
        if self._map.closed:
            return
        del self._anchor
        self._map.close()


@dataclass(frozen=True)
class Region:
    """A registered `Memory`: what local work requests (lkey) and peers (addr, rkey) name it by."""

    memory: Memory
    rkey: int
    lkey: int
    handle: object = None  # the provider's memory-region object, kept alive with the region

    @property
    def addr(self) -> int:
        return self.memory.address

    @property
    def length(self) -> int:
        return self.memory.length


@dataclass(frozen=True)
class Completion:
    wr_id: int
    opcode: int
    qp_num: int
    byte_len: int
    imm: Optional[int]  # host order; None if the completion carries no immediate

    @property
    def received(self) -> bool:
        """An incoming write-with-immediate (else: one of our signaled writes completed)."""
        return bool(self.opcode & 0x80)


class SendCredits:
    """Unsignaled sends with a periodic signaled one, on a send queue of `depth` entries.

    An unsignaled work request produces no completion, so its send-queue entry is known free only
    when a later signaled one completes (an RC send queue completes in order). Every
    `signal_every`-th request is signaled, and so is any request that fills the queue, so a full
    queue always ends in a completion that frees it. Requests are numbered 1, 2, ...; the number
    is the work request id.
    """

    def __init__(self, depth: int, signal_every: int):
        if not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"send queue depth must be a positive integer, got {depth!r}")
        if not isinstance(signal_every, int) or not 1 <= signal_every <= depth:
            raise ConfigError(f"signal_every must be in [1, depth={depth}], got {signal_every!r}")
        self.depth = depth
        self.signal_every = signal_every
        self.posted = 0  # requests posted so far
        self.retired = 0  # requests known complete

    @property
    def free(self) -> int:
        return self.depth - (self.posted - self.retired)

    def take(self) -> "tuple[int, bool]":
        """(work request id, signaled?) for the next request. RuntimeError if the queue is full:
        the caller must poll its completion queue first."""
        if self.free == 0:
            raise RuntimeError(f"send queue full ({self.depth} requests in flight): poll completions first")
        self.posted += 1
        signaled = self.posted % self.signal_every == 0 or self.free == 0
        return self.posted, signaled

    def completed(self, wr_id: int) -> None:
        """A signaled request completed: it and every request before it are retired."""
        if not self.retired < wr_id <= self.posted:
            raise ValueError(f"completion for request {wr_id}, but requests {self.retired + 1}..{self.posted} are in flight")
        self.retired = wr_id


def check_write(remote, region: Region, local_offset: int, nbytes: int, target, remote_offset: int) -> None:
    """What a provider checks before posting a write: its queue pair is connected (`remote` is the
    peer's ConnParams) and both spans lie in their regions. RuntimeError / ValueError: a bug in
    the caller, as the data path computes every span from the shared layout."""
    if remote is None:
        raise RuntimeError("write_imm before connect()")
    if local_offset < 0 or local_offset + nbytes > region.length:
        raise ValueError(f"local span [{local_offset}, +{nbytes}) is outside the registered region")
    if remote_offset < 0 or remote_offset + nbytes > target.length:
        raise ValueError(f"remote span [{remote_offset}, +{nbytes}) is outside the peer's {target.length}-byte region")


class Writer:
    """One queue pair's outgoing writes: posted at once while its send queue has room, else held
    back in order and posted by `pump()` (which `drain` calls once completions free the queue).

    Why holding back is safe for PHub's buffers: a source (a worker's gradient, a chunk's new
    weights) is rewritten only after the peer has answered the write, which it cannot do before
    the write has landed.
    """

    __slots__ = ("conn", "backlog")

    def __init__(self, conn):
        self.conn = conn
        self.backlog: deque = deque()

    def write(self, region: Region, local_offset: int, nbytes: int, target, remote_offset: int, imm: int) -> None:
        if self.backlog or self.conn.credits.free == 0:
            self.backlog.append((region, local_offset, nbytes, target, remote_offset, imm))
        else:
            self.conn.write_imm(region, local_offset, nbytes, target, remote_offset, imm)

    def pump(self) -> None:
        backlog, conn = self.backlog, self.conn
        while backlog and conn.credits.free:
            conn.write_imm(*backlog.popleft())


def drain(nic, writers: Dict[int, Writer], max_entries: int = 256) -> List[Completion]:
    """Poll `nic` once: retire signaled writes, re-post a receive for each write that landed,
    resume held-back writes; return the landed writes (receive completions) in arrival order.

    `writers` maps queue pair numbers to their `Writer`. Raises JobFailed (from the provider) if
    a work request failed, ProtocolError if a completion names an unknown queue pair.
    """
    landed = []
    for completion in nic.poll(max_entries):
        writer = writers.get(completion.qp_num)
        if writer is None:
            raise ProtocolError(f"an RDMA completion for queue pair {completion.qp_num}, which is not ours")
        if completion.received:
            writer.conn.post_receives(1)
            landed.append(completion)
        else:
            writer.conn.credits.completed(completion.wr_id)
    for writer in writers.values():
        if writer.backlog:
            writer.pump()
    return landed
