"""The pieces of PHub's RDMA (verbs) transport.

PHub moves chunks with InfiniBand RC queue pairs: each (server core, NIC) registers its buffers
once; a worker pushes a chunk with one RDMA write-with-immediate straight into its own slot on the
owning core (the 32-bit immediate says who and which chunk); the core polls its completion queue,
aggregates, and writes the new weights straight back into every worker's buffer the same way. No
pull requests, no per-message metadata, unsignaled sends.

- `immediate`  the immediate's bit split (12-bit rank, 20-bit chunk id), its limits, and turning
               a push completion into the PUSH header the aggregation state machine takes.
- `layout`     the registration plan: one region per (core, NIC), where every slot, weight and
               result block sits; the worker's region; slot addressing from either side.
- `connect`    queue-pair connection parameters, validated, carried in the HELLO/WELCOME
               handshake of the TCP control channel.
- `verbs`      the thin pyverbs layer (device probe, memory, PD/MR/CQ, RC queue pairs,
               write-with-immediate, polling, send credits). pyverbs is imported on first use.

What is wired: `phub doctor` reports the RDMA devices through `verbs.probe`, and choosing the
verbs transport (`ServerConfig.transport`, `--transport verbs`) fails at start with the doctor's
explanation. What is not: the server and worker event loops still move chunks over TCP only; the
loops that would post writes and poll completions with these pieces are not written, because
they cannot be tested without RDMA hardware. Everything here that needs no device is unit-tested.
"""
from .connect import ConnParams
from .immediate import CHUNK_BITS, MAX_CHUNKS, MAX_RANKS, RANK_BITS
from .layout import CoreRegistration, WorkerRegistration

__all__ = ["ConnParams", "CoreRegistration", "WorkerRegistration",
           "RANK_BITS", "CHUNK_BITS", "MAX_RANKS", "MAX_CHUNKS"]
