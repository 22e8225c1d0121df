"""PHub's RDMA (verbs) data path.

PHub moves chunks with InfiniBand RC queue pairs: each (server core, NIC) registers its buffers
once per batch; a worker pushes a chunk with one RDMA write-with-immediate straight into its own
slot on the owning core (the 32-bit immediate says who and which chunk); the core polls its
completion queue, aggregates, and writes the new weights straight back into every worker's
region the same way. No pull requests, no per-message metadata, unsignaled sends. The lane's TCP
connection carries the handshake and the control frames.

- `immediate`  the immediate's bit split (12-bit rank, 20-bit chunk id), its limits, and turning
               a push completion into the PUSH header the aggregation state machine takes.
- `layout`     the registration plan: where every slot, weight and result block sits, from
               either side.
- `connect`    queue-pair connection parameters, validated, carried in HELLO/WELCOME (the
               queue pair) and REGISTER/READY (each batch's region).
- `fabric`     what the data path asks of a provider, and what it shares across providers
               (registered memory, send credits, held-back writes, one poll).
- `core_verbs`  a server core's side, per job (`CoreVerbs`, a `phub.network.datapath.ServerPath`).
- `worker_verbs` a worker's side (`WorkerVerbs`, a `phub.network.datapath.WorkerPath`).
- `verbs`      the pyverbs provider (transport "verbs"); pyverbs is imported on first use.
- `soft`       the software provider (transport "soft-verbs"): the same operations between
               processes of one machine, so the data path runs, and is tested, without RDMA.
"""
from .connect import ConnParams
from .immediate import CHUNK_BITS, MAX_CHUNKS, MAX_RANKS, RANK_BITS
from .layout import CoreRegistration, WorkerRegistration

__all__ = ["ConnParams", "CoreRegistration", "WorkerRegistration",
           "RANK_BITS", "CHUNK_BITS", "MAX_RANKS", "MAX_CHUNKS"]
