"""How chunks move between workers and a server core: one small interface per side, chosen by
transport name from a registry, so neither the core's loop nor the worker's branches on it.

Every lane keeps one TCP connection for the handshake and the control frames (HELLO, REGISTER,
READY, BYE, ERROR, ...). What a data path decides is how the pushes and the results travel:

    transport     server side                       worker side
    "tcp"         `TcpServerPath` (below): RESULT    `TcpWorkerPath` (below): PUSH data frames
                  data frames on the lane's link     on the lane's link
    "verbs"       `phub.rdma.serving.CoreVerbs`      `phub.rdma.worker.WorkerVerbs`
    "soft-verbs"  the same, over phub.rdma.soft (one machine, no device: the test double)

The TCP classes are also the interface's reference: every method a data path must have, what it
returns, and the defaults. Nothing here blocks; the RDMA paths raise ProtocolError for what a
peer got wrong and JobFailed for a work request that failed (the caller fails the job).
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Sequence

import numpy as np

from .protocol import wire
from .chunking import ITEMSIZE
from .errors import ConfigError

_PUSH, _RESULT = wire.Kind.PUSH, wire.Kind.RESULT


class TcpServerPath:
    """One job's data path on one server core, TCP: chunks are data frames on the lanes' links."""

    # Pushes travel in order with the control frames on the same connection (an RDMA write does
    # not: there the core echoes OPTIMIZER and the worker waits for it before its next pushes).
    pushes_overtake_control = False
    # Pushes arrive as data frames, which a staged link's C loop (phub/_fastpath.c) may take.
    frames_carry_pushes = True
    # How often `poll` must be called (seconds); None: never, everything arrives on the links.
    nap: Optional[float] = None
    # Whether a failed job's arrays must stay (an RDMA path's completions may still name them).
    keeps_arrays_after_failure = False

    def __init__(self, job_id: int):
        self.job_id = job_id

    @classmethod
    def for_job(cls, transport: str, job_id: int, state, devices: Dict[int, str]) -> "TcpServerPath":
        """The registry's constructor (`server_path`), the same for every server path."""
        return cls(job_id)

    def hello(self, interface: int, lane: int, local: int, rank: int, body: dict) -> dict:
        """A worker's lane HELLO was admitted: the fields to add to its WELCOME."""
        return {}

    def registered(self, lane: int, local: int, batch: int, body: dict) -> None:
        """A worker's REGISTER of `batch` (after the state machine laid the batch out)."""

    def ready(self, lane: int, local: int, batch: int) -> dict:
        """The fields to add to one worker's READY of `batch` on `lane`."""
        return {}

    def send_result(self, state, links: Sequence) -> None:
        """Send a completed round of one chunk (`aggregation.ChunkState`) to its lane's workers."""
        chunk = state.chunk
        header = wire.pack_header(_RESULT, self.job_id, wire.SERVER_SENDER, chunk.id, state.rounds, chunk.nbytes)
        view = state.result_view
        for link in links:
            link.send(header, view)

    def send_result_frames(self, frames_by_lane: dict, links_by_lane: dict) -> None:
        """Send the RESULT frames the C loop built for the rounds it finished (lane -> the frames'
        parts, in order: a header and its payload, or a buffer of whole small frames): what
        `send_result` sends, many rounds per call. Only a path whose `frames_carry_pushes` gets
        them: there results are frames too."""
        for lane, parts in frames_by_lane.items():
            for link in links_by_lane[lane]:
                link.send(*parts)

    def poll(self) -> list:
        """The pushes that landed outside the links: (local rank, lane, PUSH header) each."""
        return []

    def close(self) -> None:
        pass


class TcpWorkerPath:
    """A worker's data path, TCP: pushes are data frames on the lanes' links, results come back
    as data frames the link writes straight into the caller's arrays."""

    pushes_overtake_control = False  # see TcpServerPath
    frames_carry_results = True  # a staged link's C loop may take the results
    # How often `deliver` must be called while results are awaited; None: never.
    nap: Optional[float] = None

    def __init__(self, job_id: int, rank: int):
        self.job_id, self.rank = job_id, rank
        self._frames: Dict[int, _KeyPushes] = {}  # by a key's first chunk id

    @classmethod
    def for_servers(cls, transport: str, job_id: int, rank: int, plan, welcomes: List[dict]) -> "TcpWorkerPath":
        """The registry's constructor (`worker_path`), the same for every worker path."""
        return cls(job_id, rank)

    def hello(self, lane: int) -> dict:
        """The fields to add to a lane's HELLO."""
        return {}

    def welcomed(self, lane: int, welcome: dict) -> None:
        """The lane's WELCOME (the server's side of the data path, if it has one)."""

    def register_batch(self, batch: int, num_lanes: int) -> List[dict]:
        """Lay out batch `batch` (the plan has it already); the fields of each lane's REGISTER."""
        return [{} for _ in range(num_lanes)]

    def ready(self, lane: int, batch: int, body: dict) -> None:
        """A lane's READY of `batch`."""

    def pushes(self, links: Sequence, chunks, iteration: int, grad: memoryview) -> list:
        """The sends of one pushpull, as (sender, *parts) items for the I/O thread (which calls
        `sender.send(*parts)`); `grad` is the key's gradient as bytes. Here one item per lane:
        its link, then header and payload of each of the key's chunks on that lane."""
        frames = self._frames.get(chunks[0].id)
        if frames is None:
            frames = self._frames[chunks[0].id] = _KeyPushes(self.job_id, self.rank, chunks)
        return frames.items(links, iteration, grad)

    def deliver(self, expect: dict) -> None:
        """Results that landed outside the links: copy each where `expect` (chunk id ->
        (destination bytes, [iteration, handle])) says, and count it in."""

    def close(self) -> None:
        pass


class _KeyPushes:
    """The PUSH frames of one key, laid out once: their headers differ from one pushpull to the
    next only in the iteration, which `items` rewrites in place. Safe because a key's next push
    waits for its previous pushpull, whose results come back only after every push of it was
    read, so no header is rewritten while it still waits to be sent.

    The items (headers and gradient slices) are kept for the next pushpull too: a training loop
    pushes a key's gradient from the same memory every time, and then nothing is sliced again
    (per chunk, that would be the worker's largest cost at small chunks). They hold a view of
    the last gradient, which keeps its memory alive until the key is pushed from other memory."""

    __slots__ = ("_iterations", "_lanes", "_items", "_links", "_source")

    def __init__(self, job_id: int, rank: int, chunks):
        headers = bytearray(b"".join(wire.pack_header(_PUSH, job_id, rank, c.id, 0, c.nbytes) for c in chunks))
        words = np.frombuffer(headers, dtype="<u4").reshape(len(chunks), wire.HEADER_BYTES // 4)
        self._iterations = words[:, wire.ITERATION_WORD]
        view, size, by_lane = memoryview(headers), wire.HEADER_BYTES, {}
        for i, c in enumerate(chunks):
            start = c.offset * ITEMSIZE
            by_lane.setdefault(c.lane, []).append((view[i * size:(i + 1) * size], start, start + c.nbytes))
        self._lanes = list(by_lane.items())
        self._items: list = []
        self._links: Optional[Sequence] = None  # the links and the gradient's (address, bytes)
        self._source: tuple = ()  # that the items were made for

    def items(self, links: Sequence, iteration: int, grad: memoryview) -> list:
        self._iterations[:] = iteration
        # The address names the memory: the kept items hold the last gradient's, so no other
        # buffer can be at the same address while they are kept.
        source = (np.frombuffer(grad, np.uint8).__array_interface__["data"][0], len(grad))
        if links is not self._links or source != self._source:
            items = []
            for lane, frames in self._lanes:
                parts = [links[lane]]
                for header, start, end in frames:
                    parts += (header, grad[start:end])
                items.append(tuple(parts))
            self._items, self._links, self._source = items, links, source
        return self._items


DEFAULT_TRANSPORT = "tcp"

# transport -> (server path, worker path), as "module:Class"; the RDMA modules load on first use.
PATHS: Dict[str, tuple] = {
    "tcp": ("phub.datapath:TcpServerPath", "phub.datapath:TcpWorkerPath"),
    "verbs": ("phub.rdma.serving:CoreVerbs", "phub.rdma.worker:WorkerVerbs"),
    "soft-verbs": ("phub.rdma.serving:CoreVerbs", "phub.rdma.worker:WorkerVerbs"),
}


def _load(transport: str, side: int):
    if transport not in PATHS:
        raise ConfigError(f"unknown transport {transport!r} (known: {', '.join(PATHS)})")
    module, _, name = PATHS[transport][side].partition(":")
    return getattr(importlib.import_module(module), name)


def server_path_class(transport: str) -> type:
    """The class of `transport`'s server path (ConfigError for an unknown transport)."""
    return _load(transport, 0)


def server_path(transport: str, job_id: int, state, devices: Dict[int, str]):
    """The data path of one job on a server core (`state`: its aggregation state; `devices`:
    interface index -> RDMA port name, for the verbs transport)."""
    return _load(transport, 0).for_job(transport, job_id, state, devices)


def worker_path(transport: str, job_id: int, rank: int, plan, welcomes: List[dict]):
    """A worker's data path, as the server's discovery WELCOMEs ask for."""
    return _load(transport, 1).for_servers(transport, job_id, rank, plan, welcomes)
