"""The worker side: `phub.connect()` and the key-value API a training loop calls.

A `Client` holds one connection per lane (see reduction/chunking.py) and a background I/O thread that
drives all of them, so a caller can hand over a layer's gradient as soon as backward produces it
(`pushpull_async`) and keep computing while its chunks are in flight. Results are written by the
I/O thread straight into the caller's output array, chunk by chunk, as the server pushes them:
there are no pull requests.

Blocking calls (`connect`, `init`, `pushpull`, `Handle.wait`, `close`) take a timeout (default:
the client's `timeout`) and raise `PHubTimeout` naming what is missing; a lost worker or server
raises `JobFailed` in every waiting call, naming the cause. The I/O thread's half lives in
ioloop.py. A client still open when its process ends leaves the job as `close()` would
(exiting.py): a script that ends without `close()` has succeeded.
"""
from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections import deque
from typing import Dict, Hashable, List, Optional

import numpy as np

from . import exiting
from ..protocol import wire
from ..reduction.chunking import ChunkPlan, Topology, as_float32
from .ioloop import ClientLoop
from ..protocol.worker import WorkerProtocol, awaited_by, expect_entry
from ..network.datapath import DEFAULT_TRANSPORT, worker_path
from .sidechannels import SideChannels
from ..config import check_timeout
from ..errors import ConfigError, JobFailed, PHubError, PHubTimeout
from ..network.fastpath_contract import fastpath
from .handle import Handle
from ..protocol.messages import MAX_WORKERS
from ..reduction.optim import Optimizer
from ..network.links import (DIRECT_MIN_BYTES, DirectLink, Link, StagedLink, connect as tcp_connect, parse_addresses,
                             recv_control, staging_capacity)

# The worker's C loops, their round contract registered; None when not built: every frame takes
# the Python path.
drain_results = recv_results = None
if fastpath is not None:
    drain_results, recv_results = fastpath.drain_results, fastpath.recv_results

DEFAULT_TIMEOUT = 300.0
MAX_JOB_ID = 2**32 - 1  # a frame header's job field is 32 bits (as JobSpec)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

# The environment `phub launch` gives every worker (and `phub.connect()` reads).
ENV_SERVER, ENV_RANK, ENV_WORKERS = "PHUB_SERVER", "PHUB_RANK", "PHUB_NUM_WORKERS"
ENV_JOB, ENV_TOKEN, ENV_TIMEOUT = "PHUB_JOB", "PHUB_TOKEN", "PHUB_TIMEOUT"


class Client(ClientLoop, SideChannels):
    """A worker's connection to a PHub server (one per process).

    Two threads share a client; each piece of state below has one writer:

    - the caller's thread (the public methods, and everything in `__init__` before the I/O
      thread starts, including the handshakes on the lanes' sockets) owns `plan`, `_iterations`,
      `_inflight` and `_closing`. It also fills in what the protocol will await (`_protocol`'s
      `expect`, `ready_waiters`, `expect_state`, `optimizer_acks`, the chunk tables, replaced
      whole) *before* it queues the frames whose answers complete them, so the I/O thread never
      meets an answer to something not yet recorded; a key's entries change only once its last
      pushpull is done (`protocol.worker.KeyResults`).
    - the I/O thread (`ClientLoop._io_loop`, once started) owns the links: their sockets, output
      queues and `_outbox`, and `_selector`, `_judging`. It alone sends, reads, writes results
      into the caller's arrays, counts them into the `Handle`s (`Handle._arrived`) and sets
      `_protocol.error` (`WorkerProtocol.fail`).
    - they hand over through `_commands` (the caller appends frames with `_submit`, the I/O thread
      pops them: single deque operations), `_wake_pending` (under `_lock`), each `Handle`'s event,
      and `_protocol.shared` / `share_waiters` (under `_protocol.lock`). `close()` flushes and
      closes the links itself only after joining the I/O thread (for at most its timeout).
    """

    def __init__(self, address: str, rank: int, num_workers: int, job_id: int = 0, token: str = "",
                 timeout: float = DEFAULT_TIMEOUT):
        """`address`: HOST:PORT of the server, or a comma-separated list of shards' addresses."""
        if not _is_int(num_workers) or not 1 <= num_workers <= MAX_WORKERS:
            raise ConfigError(f"num_workers must be an integer in [1, {MAX_WORKERS}], got {num_workers!r}")
        if not _is_int(rank) or not 0 <= rank < num_workers:
            raise ConfigError(f"rank must be in [0, {num_workers}), got {rank!r}")
        if not _is_int(job_id) or not 0 <= job_id <= MAX_JOB_ID:
            raise ConfigError(f"job_id must be an integer in [0, {MAX_JOB_ID}] (a frame's job field), got {job_id!r}")
        timeout = check_timeout(timeout)
        self.rank, self.num_workers, self.job_id, self.timeout = rank, num_workers, job_id, timeout
        self._protocol = WorkerProtocol(job_id, rank, num_workers, token)  # what this worker awaits
        self._closing = False
        self._iterations: Dict[Hashable, int] = {}
        self._inflight: Dict[Hashable, Handle] = {}
        self._commands: deque = deque()
        self._wake_pending = False
        self._judging = False  # ClientLoop._lost_lane is reading the other lanes
        self._lock = threading.Lock()  # guards _wake_pending

        addresses = [part.strip() for part in address.split(",") if part.strip()]
        welcomes = [self._discover(a) for a in parse_addresses(address)]
        shape = [(len(w["interfaces"]), w["cores"], w["lanes_per_pair"], w["chunk_bytes"]) for w in welcomes]
        if len(set(shape)) != 1:
            raise ConfigError(f"the shards {addresses} differ in (interfaces, cores, lanes per pair, "
                              f"chunk bytes): {shape}; start them with the same options")
        interfaces, cores, lanes_per_pair, chunk_bytes = shape[0]
        # The first of a server's workers sets its initial weights and optimizer: rank 0, or on
        # a rack server (two-phase reduction) the rack's first rank.
        self._leader = self.rank == welcomes[0].get("first_rank", 0)
        self.topology = Topology(interfaces, cores, lanes_per_pair, servers=len(welcomes))
        self.plan = ChunkPlan(self.topology, chunk_bytes)
        self.transport = welcomes[0].get("transport", DEFAULT_TRANSPORT)
        self._protocol.data = worker_path(self.transport, job_id, rank, self.plan, welcomes)
        self._selector = selectors.DefaultSelector()
        self._links: List[Link] = []
        self._outbox: List[Link] = []  # links with output queued in this I/O loop iteration
        try:
            for lane in range(self.topology.lanes):
                t = self.topology
                host, port = welcomes[t.lane_server(lane)]["endpoints"][t.lane_core(lane)][t.lane_interface(lane)]
                self._links.append(self._open_lane(lane, (host, port)))
        except BaseException:
            for link in self._links:
                link.close()
            raise
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._io_loop, name=f"phub-io-{rank}", daemon=True)
        self._thread.start()
        self._pid = os.getpid()
        exiting.track(self)  # a script that ends without close() still leaves the job cleanly

    # -- connection setup (blocking, before the I/O thread exists) ---------------------------
    def _hello(self, sock: socket.socket, lane: int) -> dict:
        fields = {}
        if lane >= 0:
            fields = dict(shard=self.topology.lane_server(lane), shards=self.topology.servers, **self._data.hello(lane))
        sock.sendall(self._protocol.hello(lane, **fields))
        body = self._protocol.welcome(recv_control(sock, self.timeout, "the phub server"))
        if lane >= 0:
            self._data.welcomed(lane, body)
        return body

    def _discover(self, address) -> dict:
        sock = tcp_connect(address, self.timeout)
        try:
            return self._hello(sock, -1)
        except PHubTimeout as exc:
            raise PHubTimeout(f"{exc} (at {address[0]}:{address[1]})") from None
        finally:
            sock.close()

    def _open_lane(self, lane: int, address) -> Link:
        sock = tcp_connect(tuple(address), self.timeout)
        sock.settimeout(self.timeout)
        try:
            self._hello(sock, lane)
        except BaseException:
            sock.close()
            raise
        protocol = self._protocol
        target = lambda header: protocol.payload_target(header, lane)  # noqa: E731
        on_frame = lambda link, frame: self._on_frame(lane, link, frame)  # noqa: E731
        if drain_results is None or not self._data.frames_carry_results:
            return Link(sock, self._selector, target, on_frame, self._outbox)
        if self.plan.chunk_bytes >= DIRECT_MIN_BYTES:
            read = lambda link, fd, cursor: recv_results(  # noqa: E731
                fd, cursor, self.job_id, lane, protocol.chunk_table, protocol.expect)
            return DirectLink(sock, self._selector, target, on_frame, self._outbox, read)
        fast = lambda link, staging, start, end: drain_results(  # noqa: E731
            staging, start, end, self.job_id, lane, protocol.chunk_table, protocol.expect)
        return StagedLink(sock, self._selector, target, on_frame, self._outbox, fast,
                          staging_capacity(self.plan.chunk_bytes))

    # -- public API -------------------------------------------------------------------------
    def init(self, keys, values) -> None:
        """Register arrays and agree on their initial values; rank 0's values win.

        `keys`/`values` are one key (int or str) and one float32 array, or sequences of both.
        Blocks until the server holds the initial weights and `values` hold rank 0's values.
        Every worker must make the same `init` calls in the same order.
        """
        if isinstance(keys, (list, tuple)):
            pairs = list(zip(keys, values))
            if len(pairs) != len(keys) or len(keys) != len(values):
                raise ConfigError("init: keys and values must have the same length")
        else:
            pairs = [(keys, values)]
        for key, _ in pairs:
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise ConfigError(f"keys must be int or str, got {key!r}")
        arrays = {key: as_float32("init value", key, value) for key, value in pairs}
        self._check_failed()
        batch = len(self.plan.batches)
        new = self.plan.add_arrays([(key, arr.shape) for key, arr in arrays.items()])
        self._protocol.chunks_changed(self.plan)
        flat = {key: arr.reshape(-1) for key, arr in arrays.items()}
        handle = Handle(self, len(new) + len(self._links), None, f"init of batch {batch}", [c.id for c in new])
        self._protocol.ready_waiters[batch] = handle
        awaited = awaited_by(0, handle)
        for chunk in new:
            self._iterations.setdefault(chunk.key, 0)
            dest = memoryview(flat[chunk.key][chunk.offset:chunk.offset + chunk.size]).cast("B")
            self._protocol.expect[chunk.id] = expect_entry(dest, awaited)
        register = {"batch": batch, "arrays": [[k, int(a.size)] for k, a in arrays.items()]}
        lane_fields = self._data.register_batch(batch, len(self._links))
        frames = [(link, wire.control_frame(wire.Kind.REGISTER, self.job_id, self.rank, {**register, **fields}, batch))
                  for link, fields in zip(self._links, lane_fields)]
        if self._leader:
            for chunk in new:
                data = memoryview(flat[chunk.key][chunk.offset:chunk.offset + chunk.size]).cast("B")
                header = wire.pack_header(wire.Kind.INIT, self.job_id, self.rank, chunk.id, 0, chunk.nbytes)
                frames.append((self._links[chunk.lane], header, data))
        self._submit(frames)
        handle.wait()

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Run `optimizer` on the server (only rank 0's call takes effect, as in MXNet, or each
        rack's first rank's with two-phase reduction). It applies to every round of a chunk that
        completes after it reaches the server, so a round this worker pushed already but that
        waits for slower workers may use it too: to switch at an exact iteration (e.g. a new
        learning rate), `wait_all()` first. Does not block on TCP; on an RDMA transport the
        leader waits (one round trip, up to `timeout`) until every lane has applied it, as its
        pushes there do not travel behind it."""
        if not isinstance(optimizer, Optimizer):
            raise ConfigError(f"set_optimizer takes a phub optimizer (NAG, SGD, Aggregate), got {optimizer!r}")
        self._check_failed()
        if not self._leader:
            return
        echoed = self._data.pushes_overtake_control  # then the server echoes it once applied
        if echoed:
            acks = self._protocol.optimizer_acks = Handle(self, len(self._links), None, "set_optimizer", [])
        self._to_all_lanes(wire.control_frame(wire.Kind.OPTIMIZER, self.job_id, self.rank, optimizer.to_dict()))
        if echoed:
            acks.wait()

    def pushpull_async(self, key, grad: np.ndarray, out: Optional[np.ndarray] = None) -> Handle:
        """Push `grad` for `key`; the returned handle's `wait()` gives `out` holding the result
        (new weights, or the aggregate). `out` defaults to `grad` itself (overwritten in place).
        Neither array may be touched until the handle is done. A second push of the same key
        first waits for the previous one."""
        chunks = self.plan.key_chunks(key)
        size = self.plan.key_size(key)
        grad_flat = as_float32("gradient", key, grad, size)
        out = grad if out is None else out
        as_float32("output", key, out, size)  # checked: the results land in it
        previous = self._inflight.get(key)
        if previous is not None and not previous.done():
            previous.wait()
        self._check_failed()
        iteration = self._iterations[key] + 1
        self._iterations[key] = iteration
        handle = Handle(self, len(chunks), out, f"pushpull of key {key!r} (iteration {iteration})",
                        [c.id for c in chunks])
        self._protocol.expect_key(key, out, self.plan.key_spans(key), iteration, handle)
        self._inflight[key] = handle
        self._submit(self._data.pushes(self._links, chunks, iteration, memoryview(grad_flat).cast("B")))
        return handle

    def pushpull(self, key, grad: np.ndarray, out: Optional[np.ndarray] = None,
                 timeout: Optional[float] = None) -> np.ndarray:
        """Push a gradient and block until the result is in `out` (default: `grad`); returns it."""
        if timeout is not None:
            check_timeout(timeout)  # before anything is pushed
        return self.pushpull_async(key, grad, out).wait(timeout)

    def wait_all(self, timeout: Optional[float] = None) -> None:
        """Block until every pushpull issued so far is done: at most `timeout` in all (default
        the client's), then PHubTimeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else check_timeout(timeout))
        for handle in list(self._inflight.values()):
            handle.wait(max(deadline - time.monotonic(), 0.001))

    def close(self, timeout: Optional[float] = None, abort: Optional[str] = None) -> None:
        """Finish in-flight work, tell the server this worker is done (BYE), and close. Idempotent.

        Blocks until this worker's pushpulls are done (at most `timeout`, default the client's);
        if they are not, the worker gives up (the server fails the job naming this rank) and
        PHubTimeout is raised. With `abort` (a message) it gives up at once, saying that. The
        process's exit does the same for a client still open (see phub/client/exiting.py)."""
        if self._closing:
            return
        try:
            if self._protocol.error is None and abort is None:
                try:
                    self.wait_all(timeout)
                except PHubTimeout as exc:
                    abort = f"rank {self.rank} closed with work in flight: {exc}"
                    raise
                self._to_all_lanes(wire.control_frame(wire.Kind.BYE, self.job_id, self.rank, {}))
        finally:
            if abort is not None and self._protocol.error is None:
                self._abort(abort)
            self._closing = True
            exiting.closed(self)
            self._wake()
            self._thread.join(self.timeout if timeout is None else timeout)
            for link in self._links:
                link.flush_blocking(1.0)
                link.close()
            self._wake_r.close()
            self._wake_w.close()
            self._data.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close(abort=None if exc[0] is None else f"rank {self.rank} raised {exc[0].__name__}: {exc[1]}")

    @property
    def _data(self):
        """How chunks move (tcp.TcpWorkerPath, or an RDMA one): the server's choice, held by
        the protocol, which hands it what arrives; None until the servers have answered."""
        return self._protocol.data

    def _check_failed(self) -> None:
        if self._protocol.error is not None:
            raise JobFailed(f"rank {self.rank}: {self._protocol.error}")
        if self._closing:
            raise PHubError("the client is closed")

    def _awaiting(self, chunks) -> list:
        """Of `chunks`, those whose result has not arrived yet (a timed-out Handle names them)."""
        return self._protocol.awaiting(chunks)


def connect(address: Optional[str] = None, rank: Optional[int] = None, num_workers: Optional[int] = None,
            job_id: Optional[int] = None, token: Optional[str] = None, timeout: Optional[float] = None) -> Client:
    """Connect this worker to its PHub server. Arguments not given come from the environment
    `phub launch` sets (PHUB_SERVER, PHUB_RANK, PHUB_NUM_WORKERS, PHUB_JOB, PHUB_TOKEN, PHUB_TIMEOUT).

    Blocks until every lane is connected (at most `timeout` per step); raises ConfigError for a
    missing or malformed setting, JobFailed if the server refuses (wrong job or token), OSError if
    it cannot be reached.
    """
    def env(name, given, convert, default=None):
        if given is not None:
            return given
        text = os.environ.get(name)
        if text is None:
            if default is not None:
                return default
            raise ConfigError(f"{name} is not set: pass it to phub.connect() or start workers with `phub launch`")
        try:
            convert(text)
        except ValueError as exc:  # ConfigError is one
            raise ConfigError(f"{name}={text!r} is not a valid value: {exc}") from None
        return convert(text)

    def server(text):
        parse_addresses(text)
        return text

    def integer(low, high):
        def convert(text):
            value = int(text)
            if not low <= value <= high:
                raise ValueError(f"must be an integer in [{low}, {high}]")
            return value
        return convert

    return Client(env(ENV_SERVER, address, server), env(ENV_RANK, rank, integer(0, MAX_WORKERS - 1)),
                  env(ENV_WORKERS, num_workers, integer(1, MAX_WORKERS)),
                  env(ENV_JOB, job_id, integer(0, MAX_JOB_ID), 0), env(ENV_TOKEN, token, str, ""),
                  env(ENV_TIMEOUT, timeout, lambda t: check_timeout(float(t)), DEFAULT_TIMEOUT))
