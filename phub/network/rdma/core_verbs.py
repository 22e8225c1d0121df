"""The server core's side of the verbs data path, for one job (a `phub.network.datapath.ServerPath`).

The TCP connection of each (lane, worker) stays: it carries the handshake and every control
frame. What moves to RDMA is the data:

    HELLO    {"rdma": worker QP}         -> a queue pair on the lane's NIC, connected to it;
    WELCOME  {"rdma": server QP}            the worker connects its side (`hello`)
    REGISTER {"rdma": worker region}     -> kept per (lane, worker, batch) (`registered`): where the
                                            worker wants this batch's results written
    (the batch's buffers)                -> one registered region per (NIC, batch), laid out by
                                            `layout.CoreRegistration`; the aggregation state's
                                            weights, slots and results live in it (`buffers`)
    READY    {"rdma": server region}     <- per worker (`ready`): where its slots are
    push                                 <- a write-with-immediate into the worker's slot; `poll`
                                            turns its completion into the PUSH header the state
                                            machine takes (`immediate.push_header`)
    result                               -> a write-with-immediate of the chunk's new weights (or
                                            aggregate) into every worker's results (`send_result`)

For each interface the core serves, the job opens one NIC (protection domain, completion queue);
the job's queue pairs and regions on that interface belong to it. A job that registers all its
arrays in one `init` has one region per (core, NIC), as PHub's one-shot registration; each later
`init` adds one more. Methods raise ProtocolError for what a worker got wrong and JobFailed
for a failed work request: the core fails the job for either.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ...protocol import wire
from ...errors import ConfigError, JobFailed, ProtocolError
from ..datapath import ServerPath
from . import connect, immediate
from .fabric import RECEIVE_DEPTH, Memory, Region, Writer, drain, open_nic
from .layout import CoreRegistration, WorkerRegistration


class CoreVerbs(ServerPath):
    """One job's verbs data path on one server core (a `datapath.ServerPath`).
    `state` is the job's `aggregation.JobState`; `devices` maps interface index -> device name
    (missing: the provider's first usable port)."""

    pushes_overtake_control = True  # an RDMA write does not queue behind the lane's control frames
    frames_carry_pushes = False
    keeps_arrays_after_failure = True  # completions still in the queues name the state's chunks

    @classmethod
    def for_job(cls, transport: str, job_id: int, state, devices: Dict[int, str]) -> "CoreVerbs":
        return cls(transport, state, devices)

    def __init__(self, transport: str, state, devices: Optional[Dict[int, str]] = None):
        self.transport = transport
        self.state = state
        self.devices = devices or {}
        self.nics: Dict[int, object] = {}
        self.registration: Optional[CoreRegistration] = None
        self.regions: Dict[Tuple[int, int], Region] = {}  # (interface, batch) -> this core's region
        self.peers: Dict[Tuple[int, int], tuple] = {}  # (lane, local) -> (writer, rank, interface)
        self.by_qp: Dict[int, Dict[int, Tuple[int, int]]] = {}  # interface -> qp_num -> (lane, local)
        self.writers: Dict[int, Dict[int, Writer]] = {}  # interface -> qp_num -> writer
        self.targets: Dict[Tuple[int, int, int], connect.ConnParams] = {}  # (lane, local, batch) -> region
        self.worker_layouts: Dict[int, WorkerRegistration] = {}
        state.buffers = self.buffers

    @property
    def nap(self) -> float:
        return min((nic.nap for nic in self.nics.values()), default=1.0)

    def _nic(self, interface: int):
        if interface not in self.nics:
            self.nics[interface] = open_nic(self.transport, self.devices.get(interface))
            self.by_qp[interface], self.writers[interface] = {}, {}
        return self.nics[interface]

    # -- handshake ------------------------------------------------------------------------------
    def hello(self, interface: int, lane: int, local: int, rank: int, body: dict) -> dict:
        """A worker's lane HELLO: make and connect its queue pair; return the WELCOME's rdma field.
        ProtocolError / ConfigError / JobFailed refuse the worker."""
        remote = connect.extract(body, f"rank {rank}")
        try:
            nic = self._nic(interface)
            conn = nic.connection()
            conn.connect(remote)
            conn.post_receives(RECEIVE_DEPTH)
        except (ConfigError, JobFailed):
            raise
        except Exception as exc:  # the provider's own error (pyverbs raises its own classes)
            raise JobFailed(f"cannot connect a queue pair for rank {rank} on interface {interface}: {exc}") from None
        writer = Writer(conn)
        self.peers[(lane, local)] = (writer, rank, interface)
        self.by_qp[interface][conn.qp_num] = (lane, local)
        self.writers[interface][conn.qp_num] = writer
        return {"rdma": conn.local_params(nic.scratch).to_json()}

    def registered(self, lane: int, local: int, batch: int, body: dict) -> None:
        """A REGISTER's region (after the state machine laid out the batch): checked to cover it."""
        writer, rank, _ = self.peers[(lane, local)]
        target = connect.extract(body, f"rank {rank}")
        if target.qp_num != writer.conn.remote.qp_num:
            raise ProtocolError(f"rank {rank} registered batch {batch} for queue pair {target.qp_num}, "
                                f"its lane {lane} connected queue pair {writer.conn.remote.qp_num}")
        target.check_covers(self._worker_layout(batch).length, f"rank {rank}")
        self.targets[(lane, local, batch)] = target

    def _worker_layout(self, batch: int) -> WorkerRegistration:
        """Where a worker keeps batch `batch`'s results (every worker computes the same)."""
        if batch not in self.worker_layouts:
            self.worker_layouts[batch] = WorkerRegistration(self.state.plan, batch)
        return self.worker_layouts[batch]

    def ready(self, lane: int, local: int, batch: int) -> dict:
        """The READY's rdma field for one worker: this core's region of the lane's NIC and batch."""
        writer, _, interface = self.peers[(lane, local)]
        region = self.regions.get((interface, batch), self.nics[interface].scratch)  # scratch: no chunks here
        return {"rdma": writer.conn.local_params(region).to_json()}

    # -- buffers --------------------------------------------------------------------------------
    def buffers(self, chunks) -> list:
        """The `JobState.buffers` hook: one batch's owned chunks, laid out in registered memory."""
        state = self.state
        try:
            if self.registration is None:
                self.registration = CoreRegistration.for_job_state(state)
            else:
                self.registration.extend()
        except ConfigError as exc:  # the job outgrew what an immediate can name
            raise ProtocolError(str(exc)) from None
        batch = chunks[0].batch if chunks else len(state.plan.batches) - 1
        groups = []
        for interface in self.registration.interfaces:
            blocks = self.registration.batch_blocks(interface, batch)
            if blocks is None:
                continue
            try:
                memory = Memory(blocks.end - blocks.slots)
                self.regions[(interface, batch)] = self._nic(interface).register(memory)
            except Exception as exc:  # out of memory, or the device refuses to pin it
                raise JobFailed(f"cannot register {blocks.end - blocks.slots} bytes for batch {batch} "
                                f"on interface {interface}: {exc}") from None
            n, base = blocks.elements, blocks.slots
            slots = memory.floats(0, state.num_workers * n).reshape(state.num_workers, n)
            groups.append(([state.plan.chunks[c] for c in blocks.chunk_ids], memory.floats(blocks.weights - base, n),
                           slots, memory.floats(blocks.results - base, n)))
        return groups

    # -- data -----------------------------------------------------------------------------------
    def send_result(self, chunk_state, links=()) -> None:
        """Write a chunk's result (its weights, or in aggregation mode its aggregate) to every
        worker of its lane (not over its `links`); the immediate names the worker and the chunk."""
        reg, chunk = self.registration, chunk_state.chunk
        source = reg.weights(chunk.id) if chunk_state.result_view is chunk_state.weight_view else reg.result(chunk.id)
        region = self.regions[(source.interface, chunk.batch)]
        offset = reg.in_batch_region(source, chunk.id)
        remote_offset, nbytes = self._worker_layout(chunk.batch).result(chunk.id)  # the same in every worker
        for local in range(self.state.num_workers):
            writer, rank, _ = self.peers[(chunk.lane, local)]
            target = self.targets[(chunk.lane, local, chunk.batch)]
            writer.write(region, offset, nbytes, target, remote_offset, immediate.encode(rank, chunk.id))

    def poll(self) -> List[Tuple[int, int, wire.Header]]:
        """The pushes that landed since the last poll: (local rank, lane, PUSH header), checked
        as a TCP push is (ProtocolError names the worker); never blocks."""
        pushes = []
        for interface, nic in self.nics.items():
            by_qp = self.by_qp[interface]
            for completion in drain(nic, self.writers[interface]):
                lane, local = by_qp[completion.qp_num]
                rank = self.peers[(lane, local)][1]
                header = immediate.push_header(completion.imm, completion.byte_len, lane=lane, rank=rank,
                                               local=local, state=self.state)
                pushes.append((local, lane, header))
        return pushes

    def close(self) -> None:
        for nic in self.nics.values():
            nic.close()
        self.nics.clear()
