"""The 32-bit immediate of an RDMA write: who wrote which chunk.

PHub's workers push a chunk with one RDMA write-with-immediate straight into their slot on the
server; the immediate is the only metadata that travels with it (the TCP transport's 32-byte
frame header has no place on the verbs path). It carries the same identity the header's `sender`
and `chunk` fields do:

    bit 31 ........ 20 19 ..................... 0
        rank (12 bits)     chunk id (20 bits)

- 12 rank bits: ranks 0..4095, exactly the 4096 workers a `JobSpec` allows.
- 20 chunk bits: chunk ids 0..1,048,575 per job, i.e. 32 GiB of float32 parameters at the
  default 32 KB chunk size (ResNet-269, the paper's largest model, has ~12,400 chunks).

On a write the server sends back (new weights of a chunk), the rank field names the worker the
result is written to, so a worker can check that a completion is meant for it.

The job and the iteration are not carried: the queue pair a completion arrives on identifies the
job and the rank (the rank in the immediate is a cross-check), and a worker pushes round k+1 of a
chunk only after it received round k's result, so the server knows which round a push belongs
to (`push_header` fills it in from the aggregation state).

Byte order: verbs defines the immediate as a big-endian (network order) 32-bit field and pyverbs
passes the integer through unchanged, so `to_wire`/`from_wire` convert at the boundary.
"""
from __future__ import annotations

import socket
from typing import Optional, Tuple

from ...protocol import wire
from ...errors import ConfigError, ProtocolError

RANK_BITS = 12
CHUNK_BITS = 20
MAX_RANKS = 1 << RANK_BITS  # 4096
MAX_CHUNKS = 1 << CHUNK_BITS  # 1,048,576
_CHUNK_MASK = MAX_CHUNKS - 1


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def encode(rank: int, chunk: int) -> int:
    """The immediate (host order) of `chunk` pushed by, or written back to, `rank`.

    Raises ConfigError naming the value that does not fit its field.
    """
    if not _is_int(rank) or not 0 <= rank < MAX_RANKS:
        raise ConfigError(f"rank {rank!r} does not fit the RDMA immediate's {RANK_BITS}-bit rank field "
                          f"(ranks 0..{MAX_RANKS - 1})")
    if not _is_int(chunk) or not 0 <= chunk < MAX_CHUNKS:
        raise ConfigError(f"chunk id {chunk!r} does not fit the RDMA immediate's {CHUNK_BITS}-bit chunk field "
                          f"(chunk ids 0..{MAX_CHUNKS - 1})")
    return rank << CHUNK_BITS | chunk


def decode(imm: int) -> Tuple[int, int]:
    """(rank, chunk id) of a host-order immediate; ProtocolError if it is not a 32-bit value."""
    if not _is_int(imm) or not 0 <= imm < 1 << 32:
        raise ProtocolError(f"an RDMA immediate is a 32-bit value, got {imm!r}")
    return imm >> CHUNK_BITS, imm & _CHUNK_MASK


def to_wire(imm: int) -> int:
    """The value to put in a work request's `imm_data` (network byte order)."""
    return socket.htonl(imm)


def from_wire(imm_data: int) -> int:
    """The host-order immediate of a work completion's `imm_data`."""
    return socket.ntohl(imm_data)


def check_job(num_workers: int, num_chunks: int, chunk_bytes: Optional[int] = None, job_id: int = 0) -> None:
    """Raise ConfigError, saying what to change, if a job cannot be addressed by the immediate."""
    if num_workers > MAX_RANKS:
        raise ConfigError(f"job {job_id} has {num_workers} workers; the verbs transport's immediate carries "
                          f"at most {MAX_RANKS} ranks: use fewer workers per job or the tcp transport")
    if num_chunks > MAX_CHUNKS:
        advice = "use the tcp transport"
        if chunk_bytes:
            needed = -(-num_chunks * chunk_bytes // MAX_CHUNKS)  # bytes per chunk for the same data
            needed = -(-needed // 4) * 4
            advice = f"use --chunk-bytes {needed} or more, or the tcp transport"
        raise ConfigError(f"job {job_id} has {num_chunks} chunks; the verbs transport's immediate carries "
                          f"chunk ids below {MAX_CHUNKS}: {advice}")


def push_header(imm: int, byte_len: int, *, lane: int, rank: int, local: int, state) -> wire.Header:
    """Turn a push completion into the PUSH header the aggregation state machine expects.

    `imm` is the completion's host-order immediate and `byte_len` the bytes its write carried;
    `lane`, `rank` (the job-wide rank) and `local` (that worker's index among this server's
    workers, what `aggregation.JobState` calls its rank) are what the server knows about the
    queue pair the completion arrived on; `state` is the core's `aggregation.JobState`. The same
    checks as a TCP push run here (the chunk is owned and carried on this lane, the length
    matches, it was initialized, no second copy this round), so the caller then calls
    `state.on_push(local, header)` exactly as the TCP path does.

    Raises ProtocolError naming the rank and chunk when anything disagrees. Unlike TCP, the data
    has already landed when the check runs: a rejected push has overwritten its own slot only
    (each worker writes only its own slots), and the job fails as for any protocol error.
    """
    imm_rank, chunk = decode(imm)
    if imm_rank != rank:
        raise ProtocolError(f"a push on rank {rank}'s queue pair carries rank {imm_rank} in its immediate "
                            f"(chunk {chunk})")
    owned = state.owned.get(chunk)
    iteration = owned.rounds + 1 if owned is not None else 1
    header = wire.Header(wire.Kind.PUSH, state.job_id, rank, chunk, iteration, byte_len)
    state.push_target(local, header, lane)  # raises ProtocolError on any mismatch
    return header
