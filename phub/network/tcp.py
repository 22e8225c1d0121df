"""The TCP data path: pushes and results are data frames on the lanes' own links (the
connections that carry the control frames too, `links.Link`), so nothing lands outside them.
The interface and the registry that picks this path by transport name are in `datapath`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from ..reduction.chunking import ITEMSIZE
from ..protocol import wire
from .datapath import ServerPath, WorkerPath

_PUSH, _RESULT = wire.Kind.PUSH, wire.Kind.RESULT


class TcpServerPath(ServerPath):
    """One job's data path on one server core, TCP: chunks are data frames on the lanes' links."""

    def __init__(self, job_id: int):
        self.job_id = job_id

    @classmethod
    def for_job(cls, transport: str, job_id: int, state, devices: Dict[int, str]) -> "TcpServerPath":
        return cls(job_id)

    def send_result(self, state, links: Sequence) -> None:
        chunk = state.chunk
        header = wire.pack_header(_RESULT, self.job_id, wire.SERVER_SENDER, chunk.id, state.rounds, chunk.nbytes)
        view = state.result_view
        for link in links:
            link.send(header, view)

    def send_result_frames(self, frames_by_lane: dict, links_by_lane: dict) -> None:
        for lane, parts in frames_by_lane.items():
            for link in links_by_lane[lane]:
                link.send(*parts)


class TcpWorkerPath(WorkerPath):
    """A worker's data path, TCP: pushes are data frames on the lanes' links, results come back
    as data frames the link writes straight into the caller's arrays."""

    def __init__(self, job_id: int, rank: int):
        self.job_id, self.rank = job_id, rank
        self._frames: Dict[int, _KeyPushes] = {}  # by a key's first chunk id

    @classmethod
    def for_servers(cls, transport: str, job_id: int, rank: int, plan, welcomes: List[dict]) -> "TcpWorkerPath":
        return cls(job_id, rank)

    def pushes(self, links: Sequence, chunks, iteration: int, grad: memoryview) -> list:
        """One item per lane: its link, then header and payload of each of the key's chunks on
        that lane."""
        frames = self._frames.get(chunks[0].id)
        if frames is None:
            frames = self._frames[chunks[0].id] = _KeyPushes(self.job_id, self.rank, chunks)
        return frames.items(links, iteration, grad)


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
