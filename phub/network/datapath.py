"""How chunks move between workers and a server core: one small interface per side
(`ServerPath`, `WorkerPath`), chosen by transport name from a registry (`PATHS`), so neither the
core's loop nor the worker's branches on it.

Every lane keeps one TCP connection (a `phub.network.links.Link`) for the handshake and the
control frames (HELLO, REGISTER, READY, BYE, ERROR, ...). What a data path decides is how the
pushes and the results travel:

    transport     server side                          worker side
    "tcp"         `tcp.TcpServerPath`: RESULT data     `tcp.TcpWorkerPath`: PUSH data frames on
                  frames on the lane's link            the lane's link
    "verbs"       `rdma.core_verbs.CoreVerbs`          `rdma.worker_verbs.WorkerVerbs`
    "soft-verbs"  the same, over `rdma.soft` (one machine, no device: the test double)

The base classes below are the interface: every method a data path must have, what it returns,
and the defaults. Nothing here blocks; the RDMA paths raise ProtocolError for what a peer got
wrong and JobFailed for a work request that failed (the caller fails the job).
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Sequence

from ..errors import ConfigError


class ServerPath:
    """One job's data path on one server core."""

    # Whether pushes may overtake the control frames of their lane. A TCP push travels in order
    # with them on the same connection; an RDMA write does not: there the core echoes OPTIMIZER
    # and the worker waits for it before its next pushes.
    pushes_overtake_control = False
    # Whether pushes arrive as data frames, which a staged link's C loop (phub/_fastpath.c) may take.
    frames_carry_pushes = True
    # How often `poll` must be called (seconds); None: never, everything arrives on the links.
    nap: Optional[float] = None
    # Whether a failed job's arrays must stay (an RDMA path's completions may still name them).
    keeps_arrays_after_failure = False

    @classmethod
    def for_job(cls, transport: str, job_id: int, state, devices: Dict[int, str]) -> "ServerPath":
        """The registry's constructor (`server_path`), the same for every server path."""
        raise NotImplementedError

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
        raise NotImplementedError

    def send_result_frames(self, frames_by_lane: dict, links_by_lane: dict) -> None:
        """Send the RESULT frames the C loop built for the rounds it finished (lane -> the frames'
        parts, in order: a header and its payload, or a buffer of whole small frames): what
        `send_result` sends, many rounds per call. Only a path whose `frames_carry_pushes` gets
        them: there results are frames too."""
        raise NotImplementedError

    def poll(self) -> list:
        """The pushes that landed outside the links: (local rank, lane, PUSH header) each."""
        return []

    def close(self) -> None:
        pass


class WorkerPath:
    """A worker's data path. Called on the client's I/O thread, except the handshake methods
    (before it starts) and `register_batch` (in `init`, on the caller's thread)."""

    pushes_overtake_control = False  # see ServerPath
    # Whether results arrive as data frames, which a staged link's C loop may take.
    frames_carry_results = True
    # How often `deliver` must be called while results are awaited; None: never.
    nap: Optional[float] = None

    @classmethod
    def for_servers(cls, transport: str, job_id: int, rank: int, plan, welcomes: List[dict]) -> "WorkerPath":
        """The registry's constructor (`worker_path`), the same for every worker path."""
        raise NotImplementedError

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
        `sender.send(*parts)`); `grad` is the key's gradient as bytes."""
        raise NotImplementedError

    def deliver(self, expect: dict) -> None:
        """Results that landed outside the links: copy each where `expect` (chunk id ->
        (destination bytes, [iteration, handle])) says, and count it in."""

    def close(self) -> None:
        pass


DEFAULT_TRANSPORT = "tcp"

# transport -> (server path, worker path), as "module:Class"; each module loads on first use.
PATHS: Dict[str, tuple] = {
    "tcp": ("phub.network.tcp:TcpServerPath", "phub.network.tcp:TcpWorkerPath"),
    "verbs": ("phub.network.rdma.core_verbs:CoreVerbs", "phub.network.rdma.worker_verbs:WorkerVerbs"),
    "soft-verbs": ("phub.network.rdma.core_verbs:CoreVerbs", "phub.network.rdma.worker_verbs:WorkerVerbs"),
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
