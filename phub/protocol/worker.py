"""A worker's side of the protocol, with no I/O: the handshake's frames, and what each frame a
server core sends does to the operations the worker awaits.

`WorkerProtocol` keeps what a `phub.Client` waits for: the results of its pushpulls (each
chunk's destination, and the iteration and `Handle` awaiting it, see `KeyResults`), READYs of
its registered batches, answers to `optimizer_state`, SHAREd values, the OPTIMIZER echo of an
RDMA data path. The client's I/O thread (client/ioloop.py) hands it the frames of each lane:

    payload_target(header, lane) -> memoryview   where a RESULT / STATE payload lands (checked)
    frame_received(lane, frame)                  a whole frame: count it in, wake its waiters;
                                                 raises ServerReportedError for an ERROR frame,
                                                 ProtocolError for anything the server may not send
    fail(error)                                  the job is over for this worker: every waiter wakes

A handshake is `hello(lane, ...)` out and `welcome(frame)` back, before the I/O thread runs.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import messages, wire
from ..errors import JobFailed, PHubError, ProtocolError


class ServerReportedError(JobFailed):
    """A server core sent ERROR: it gave up on the job (the text is its message)."""


# An `expect` entry is a tuple of EXPECT_ENTRY_FIELDS (destination bytes, awaited), and `awaited`
# a list of AWAITED_FIELDS ([iteration, handle]), shared by the entries of one operation: a tuple
# and a list rather than objects with names, because the C loops of phub/_fastpath.c read them per
# result, at the positions these layouts give (phub/network/fastpath_contract.py registers them). Python
# reads them by the names below, and builds them with `expect_entry` and `awaited_by`.
EXPECT_ENTRY_FIELDS = ("destination", "awaited")
AWAITED_FIELDS = ("iteration", "handle")
DESTINATION, AWAITED = (EXPECT_ENTRY_FIELDS.index(name) for name in ("destination", "awaited"))
ITERATION, HANDLE = (AWAITED_FIELDS.index(name) for name in ("iteration", "handle"))
# WorkerProtocol.chunk_table's columns, by chunk id: the chunk's lane and payload bytes.
CHUNK_TABLE_COLUMNS = ("lane", "nbytes")


def awaited_by(iteration: int, handle) -> list:
    """What the `expect` entries of one operation share (see AWAITED)."""
    awaited = [None] * len(AWAITED_FIELDS)
    awaited[ITERATION], awaited[HANDLE] = iteration, handle
    return awaited


def expect_entry(destination, awaited: list) -> tuple:
    """An `expect` entry: a result lands in `destination` for the operation `awaited`."""
    entry = [None] * len(EXPECT_ENTRY_FIELDS)
    entry[DESTINATION], entry[AWAITED] = destination, awaited
    return tuple(entry)


def entry_handle(entry: tuple):
    """The `Handle` an `expect` entry counts its result in for."""
    return entry[AWAITED][HANDLE]


class KeyResults:
    """The `expect` entries of one key's results into one output array, made once and reused by
    every pushpull into it: only their shared `awaited` changes. A pushpull of the key starts
    only after the last one is done, when none of its entries is expected any more, so no entry
    changes while the I/O thread may read it. Per chunk and pushpull, fresh entries were the
    garbage the collector spent most of a worker's main thread on at small chunks (they live
    until their result arrives, long enough to reach the oldest generation)."""

    __slots__ = ("out", "awaited", "entries")

    def __init__(self, out: np.ndarray, spans):
        out_bytes = memoryview(out.reshape(-1)).cast("B")
        self.out = out  # the array the entries' destinations are views of (kept alive by them)
        self.awaited = awaited_by(0, None)
        self.entries = [(cid, expect_entry(out_bytes[start:end], self.awaited)) for cid, start, end in spans]


class WorkerProtocol:
    """One worker's awaited operations and the frames that complete them."""

    def __init__(self, job_id: int, rank: int, num_workers: int, token: str = ""):
        self.job_id, self.rank, self.num_workers, self.token = job_id, rank, num_workers, token
        self.error: Optional[PHubError] = None  # why the job is over for this worker
        self.data = None  # the worker's data path (tcp.TcpWorkerPath or an RDMA one), once known
        self.expect: Dict[int, tuple] = {}  # chunk id -> (destination bytes, [iteration, handle])
        self._key_results: Dict[object, KeyResults] = {}  # by key, see expect_key
        self.expect_state: Dict[int, tuple] = {}  # chunk id -> (destination bytes, handle), see optimizer_state
        self.ready_waiters: Dict[int, object] = {}  # batch -> handle counting READY frames
        self.share_waiters: Dict[str, object] = {}  # name -> handle (see Client.share)
        self.shared: Dict[str, object] = {}  # name -> rank 0's value
        self.optimizer_acks = None  # a handle counting OPTIMIZER echoes (RDMA data paths)
        self.lock = threading.Lock()  # `shared` and `share_waiters` are also read by the caller's thread
        self.chunk_nbytes: List[int] = []
        self.chunk_lanes: List[int] = []
        self.chunk_table = np.zeros((0, len(CHUNK_TABLE_COLUMNS)), dtype=np.int32)  # by chunk id, for drain_results

    # -- handshake ---------------------------------------------------------------------------
    def hello(self, lane: int, **fields) -> bytes:
        """The HELLO of a lane (-1: discovery only), with the data path's and the shard's `fields`."""
        hello = {"job": self.job_id, "token": self.token, "rank": self.rank, "num_workers": self.num_workers,
                 "lane": lane, **fields}
        return wire.control_frame(wire.Kind.HELLO, self.job_id, self.rank, hello)

    def welcome(self, frame: wire.Frame) -> dict:
        """The server's answer to a HELLO: its WELCOME's fields; JobFailed if it refused (ERROR),
        ProtocolError for any other frame."""
        header, body = frame.header, frame.json()
        if header.kind is wire.Kind.ERROR:
            raise JobFailed(f"the server refused rank {self.rank}: {body.get('message')}")
        if header.kind is not wire.Kind.WELCOME:
            raise ProtocolError(f"expected WELCOME from the server, got {header.kind.name}")
        return body

    def chunks_changed(self, plan) -> None:
        """The plan's chunks after an `init` (every table is replaced whole: the I/O thread reads them)."""
        self.chunk_nbytes = plan.chunk_nbytes()
        self.chunk_lanes = [c.lane for c in plan.chunks]
        rows = [[getattr(c, column) for column in CHUNK_TABLE_COLUMNS] for c in plan.chunks]  # Chunk.lane, .nbytes
        self.chunk_table = np.array(rows, dtype=np.int32).reshape(-1, len(CHUNK_TABLE_COLUMNS))

    def expect_key(self, key, out: np.ndarray, spans, iteration: int, handle) -> None:
        """Await a pushpull's results of `key` into `out` (`spans`: the key's (chunk id, first
        byte, end byte) in it, see ChunkPlan.key_spans), for `handle`. Only when the key's
        previous pushpull is done (see KeyResults)."""
        results = self._key_results.get(key)
        if results is None or results.out is not out:
            results = self._key_results[key] = KeyResults(out, spans)
        results.awaited[ITERATION] = iteration
        results.awaited[HANDLE] = handle
        self.expect.update(results.entries)

    # -- frames ------------------------------------------------------------------------------
    def payload_target(self, header: wire.Header, lane: int) -> memoryview:
        wire.check_sender(header, job=self.job_id, sender=wire.SERVER_SENDER)
        lanes = self.chunk_lanes
        if header.kind is wire.Kind.STATE:  # an answer to optimizer_state
            wire.check_chunk(header, self.chunk_nbytes, lambda cid: lanes[cid] == lane)
            if header.chunk not in self.expect_state:
                raise ProtocolError(f"unexpected STATE for chunk {header.chunk}")
            return self.expect_state[header.chunk][0]
        if header.kind is not wire.Kind.RESULT:
            raise ProtocolError(f"the server sent a {header.kind.name} data frame")
        wire.check_chunk(header, self.chunk_nbytes, lambda cid: lanes[cid] == lane)
        expected = self.expect.get(header.chunk)
        if expected is None or expected[AWAITED][ITERATION] != header.iteration:
            raise ProtocolError(f"unexpected RESULT for chunk {header.chunk} iteration {header.iteration}")
        return expected[DESTINATION]

    def frame_received(self, lane: int, frame: wire.Frame) -> None:
        kind = frame.header.kind
        if kind is wire.Kind.RESULT:  # its payload is in place already (payload_target)
            entry_handle(self.expect.pop(frame.header.chunk))._arrived()
        elif kind is wire.Kind.READY:
            body = frame.json()
            batch = messages.ready(body)
            if batch not in self.ready_waiters:
                raise ProtocolError(f"READY for batch {batch}, which this worker did not register")
            self.data.ready(lane, batch, body)
            self.ready_waiters[batch]._arrived()
        elif kind is wire.Kind.OPTIMIZER and self.data.pushes_overtake_control and self.optimizer_acks is not None:
            self.optimizer_acks._arrived()
        elif kind is wire.Kind.STATE:
            self.expect_state.pop(frame.header.chunk)[1]._arrived()
        elif kind is wire.Kind.SHARE:
            name, value = messages.share(frame.json())
            with self.lock:
                self.shared[name] = value
                handle = self.share_waiters.get(name)
            if handle is not None and not handle.done():
                handle._arrived()
        elif kind is wire.Kind.ERROR:
            raise ServerReportedError(frame.json().get("message", "the server reported an error"))
        else:
            raise ProtocolError(f"the server sent an unexpected {kind.name} frame")

    def awaiting(self, chunk_ids: Sequence[int]) -> List[int]:
        """Those of `chunk_ids` whose result has not arrived."""
        return [c for c in chunk_ids if c in self.expect]

    def fail(self, error: PHubError) -> None:
        """The job is over for this worker (the first error is the one kept): wake every waiter."""
        if self.error is None:
            self.error = error
        for entry in list(self.expect.values()):
            entry_handle(entry)._event.set()
        for _, handle in list(self.expect_state.values()):
            handle._event.set()
        for handle in [*self.ready_waiters.values(), *self.share_waiters.values(), self.optimizer_acks]:
            if handle is not None:
                handle._event.set()
