"""The worker's side of the verbs data path (a `phub.network.datapath.WorkerPath`, when the server runs it).

A worker opens one NIC, and one queue pair per lane, connected in the lane's HELLO/WELCOME. Per
registered batch it registers one region (`layout.WorkerRegistration`: results, then gradients)
and tells every lane where it is (REGISTER's "rdma" field); each lane's READY says where the
owning core's region for that batch is. Then a push is: copy the chunk's gradient into the
gradients block, write it with an immediate straight into this worker's slot on the owning core
(its address computed by `layout.CoreRegistration`, exactly as the core laid it out). The core
writes the result back into the results block; `poll` reports the chunks that landed and the
client copies them out to the caller's array. Calls are made on the client's I/O thread, except
the handshake ones (before it starts) and `register_batch` (in `init`, on the caller's thread: it
only adds entries, which the I/O thread reads once the batch's READY has come back).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from ...reduction.chunking import ITEMSIZE, ChunkPlan
from ...errors import ProtocolError
from ...protocol.worker import DESTINATION, entry_handle
from ..datapath import WorkerPath
from . import connect, immediate
from .fabric import RECEIVE_DEPTH, Memory, Region, Writer, drain, open_nic
from .layout import CoreRegistration, WorkerRegistration, core_lanes


ENV_RDMA_DEVICE = "PHUB_RDMA_DEVICE"  # NAME[:PORT] of the worker's RDMA port (default: the first usable)
# The I/O thread shares its process (and the GIL) with training: it sleeps at least this long
# between polls while results are awaited, where a server core polls without sleeping.
MIN_NAP = 0.0001


class WorkerVerbs(WorkerPath):
    """A worker's verbs data path (a `datapath.WorkerPath`).

    `rows[s]` is this worker's slot row on server s (its rank minus the server's first rank)
    and `workers_here[s]` how many workers that server serves."""

    pushes_overtake_control = True  # an RDMA write does not queue behind the lane's control frames
    frames_carry_results = False

    def __init__(self, transport: str, plan: ChunkPlan, rank: int, rows: List[int], workers_here: List[int],
                 device: Optional[str] = None):
        self.nic = open_nic(transport, device)
        self.plan, self.rank, self.rows, self.workers_here = plan, rank, rows, workers_here
        self.writers: Dict[int, Writer] = {}  # qp_num -> writer
        self.lane_writer: Dict[int, Writer] = {}
        self.owners: Dict[Tuple[int, int], CoreRegistration] = {}  # (server, core) -> its layout
        self.regions: Dict[int, Region] = {}  # batch -> this worker's region
        self.layouts: Dict[int, WorkerRegistration] = {}
        self.targets: Dict[Tuple[int, int], connect.ConnParams] = {}  # (lane, batch) -> core's region
        # chunk id -> (lane, batch, gradient offset, bytes, offset of our slot in the core's region, immediate)
        self.push_plan: Dict[int, Tuple[int, int, int, int, int, int]] = {}

    @classmethod
    def for_servers(cls, transport: str, job_id: int, rank: int, plan: ChunkPlan,
                    welcomes: List[dict]) -> "WorkerVerbs":
        """From the servers' discovery WELCOMEs; the port is PHUB_RDMA_DEVICE's, or the first usable."""
        return cls(transport, plan, rank, [rank - w["first_rank"] for w in welcomes],
                   [w["workers_here"] for w in welcomes], os.environ.get(ENV_RDMA_DEVICE))

    @property
    def nap(self) -> float:
        return max(self.nic.nap, MIN_NAP)

    # -- handshake (before the I/O thread runs) ----------------------------------------------
    def hello(self, lane: int) -> dict:
        """The lane HELLO's rdma field: a fresh queue pair, with receives posted for results."""
        conn = self.nic.connection()
        conn.post_receives(RECEIVE_DEPTH)
        self.lane_writer[lane] = self.writers[conn.qp_num] = Writer(conn)
        return {"rdma": conn.local_params(self.nic.scratch).to_json()}

    def welcomed(self, lane: int, welcome: dict) -> None:
        self.lane_writer[lane].conn.connect(connect.extract(welcome, "the server"))

    def register_batch(self, batch: int, num_lanes: int) -> List[dict]:
        """Register batch `batch`'s region (after the plan has it); the REGISTER rdma field of
        each of the `num_lanes` lanes."""
        layout = self.layouts[batch] = WorkerRegistration(self.plan, batch)
        region = self.regions[batch] = self.nic.register(Memory(layout.length))
        for (server, core), lanes in core_lanes(self.plan).items():
            if (server, core) in self.owners:
                self.owners[(server, core)].extend()
            else:
                self.owners[(server, core)] = CoreRegistration(self.plan, lanes, self.workers_here[server])
        topology = self.plan.topology
        for chunk_id in layout.position:  # each push's addresses, worked out once per batch
            lane = self.plan.chunks[chunk_id].lane
            server = topology.lane_server(lane)
            owner = self.owners[(server, topology.lane_core(lane))]
            offset, nbytes = layout.gradient(chunk_id)
            slot = owner.in_batch_region(owner.slot(chunk_id, self.rows[server]), chunk_id)
            self.push_plan[chunk_id] = (lane, batch, offset, nbytes, slot, immediate.encode(self.rank, chunk_id))
        return [{"rdma": self.lane_writer[lane].conn.local_params(region).to_json()} for lane in range(num_lanes)]

    def ready(self, lane: int, batch: int, body: dict) -> None:
        """A lane's READY for `batch`: where the owning core's region for the batch is."""
        target = connect.extract(body, "the server")
        topology = self.plan.topology
        owner = self.owners[(topology.lane_server(lane), topology.lane_core(lane))]
        blocks = owner.batch_blocks(topology.lane_interface(lane), batch)
        if blocks is not None:
            target.check_covers(blocks.end - blocks.slots, "the server")
        self.targets[(lane, batch)] = target

    # -- data (I/O thread) ---------------------------------------------------------------------
    def pushes(self, links, chunks, iteration: int, grad: memoryview) -> list:
        """The sends of one pushpull, as (sender, *parts) items for the I/O thread: each one
        `send(chunk id, its gradient bytes)` (the chunk id is the write's immediate, no header)."""
        return [(self, c.id, grad[c.offset * ITEMSIZE:c.offset * ITEMSIZE + c.nbytes]) for c in chunks]

    def send(self, chunk_id: int, data: memoryview) -> None:
        """Push one chunk: copy `data` (its gradient) into the region, write it into our slot."""
        lane, batch, offset, nbytes, slot, imm = self.push_plan[chunk_id]
        region = self.regions[batch]
        region.memory.bytes(offset, nbytes)[:] = data
        self.lane_writer[lane].write(region, offset, nbytes, self.targets[(lane, batch)], slot, imm)

    def poll(self) -> List[int]:
        """Chunk ids whose results landed since the last poll (ProtocolError if one is not ours)."""
        landed = []
        for completion in drain(self.nic, self.writers):
            rank, chunk_id = immediate.decode(completion.imm)
            if rank != self.rank or chunk_id >= len(self.plan.chunks) \
                    or completion.byte_len != self.plan.chunks[chunk_id].nbytes:
                raise ProtocolError(f"the server wrote {completion.byte_len} bytes for rank {rank}, chunk "
                                    f"{chunk_id} into rank {self.rank}'s results")
            landed.append(chunk_id)
        return landed

    def deliver(self, expect: dict) -> None:
        """Copy each landed result to where the client awaits it (`expect`: chunk id ->
        (destination bytes, [iteration, handle])) and count it in; ProtocolError for one not awaited."""
        for chunk_id in self.poll():
            entry = expect.pop(chunk_id, None)
            if entry is None:
                raise ProtocolError(f"the server wrote a result for chunk {chunk_id}, which is not awaited")
            batch = self.plan.chunks[chunk_id].batch
            offset, nbytes = self.layouts[batch].result(chunk_id)
            entry[DESTINATION][:] = self.regions[batch].memory.bytes(offset, nbytes)
            entry_handle(entry)._arrived()

    def close(self) -> None:
        self.nic.close()
