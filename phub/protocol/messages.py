"""One validator per control message a server receives, with no I/O.

Each validator takes the decoded JSON object of one frame (`wire.Frame.json()`) and the limits the
server was started with, checks the type and bounds of every field before anything else reads the
message, and returns the fields as plain checked values. A message that breaks a rule raises
`ProtocolError` naming the message and the field (`HELLO.shards must be ...`): the core answers
with an ERROR frame and drops that connection, or fails the job if the message came from one of
its authenticated workers. Nothing here can raise anything else, whatever the JSON holds.

Bounds that depend on the job (its ranks, its lanes once its layout exists) are checked by the
core right after these, against the job's own state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Dict, Hashable, List, NamedTuple, Optional, Tuple

from ..config import DEFAULT_MAX_JOB_BYTES
from ..errors import ConfigError, ProtocolError
from ..reduction.optim import OPTIMIZERS, Optimizer, optimizer_from_dict

MAX_ID = 2**32 - 1  # job ids, ranks: what a frame header can carry
MAX_WORKERS = 4096  # as JobSpec
MAX_SHARDS = 4096  # servers a job is spread over (one per worker node at most)
MAX_TOKEN = 1024  # characters
MAX_KEY = 1024  # characters of a string key
MAX_ARRAYS = 1 << 17  # arrays in one REGISTER
MAX_MESSAGE = 1 << 16  # characters of an ERROR message kept
CHUNK_OVERHEAD = 1024  # bytes each chunk counts against the job's budget besides its values

_HELLO_FIELDS = frozenset({"job", "token", "rank", "num_workers", "lane", "shard", "shards", "rdma",
                           "peer_rack", "core", "interface"})


def _integer(message: str, name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{message}.{name} must be an integer, got {_show(value)}")
    if not low <= value <= high:
        raise ProtocolError(f"{message}.{name} = {value} is outside [{low}, {high}]")
    return value


def _string(message: str, name: str, value, limit: int) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{message}.{name} must be a string, got {_show(value)}")
    if len(value) > limit:
        raise ProtocolError(f"{message}.{name} is {len(value)} characters long (at most {limit})")
    return value


def _show(value) -> str:
    """A short description of a bad value (it may be huge or deeply nested)."""
    if isinstance(value, (dict, list)):
        return f"a {'JSON object' if isinstance(value, dict) else 'list'} of {len(value)} item(s)"
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge integer"
    return text if len(text) <= 60 else text[:57] + "..."


def _object(message: str, name: str, value) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"{message}.{name} must be a JSON object, got {_show(value)}")
    return value


@dataclass(frozen=True)
class Limits:
    """What the server was started for: the bounds every message is checked against."""

    job_ids: frozenset
    cores: int = 1
    racks: int = 1
    chunk_bytes: int = 32 * 1024
    max_job_bytes: int = DEFAULT_MAX_JOB_BYTES
    interfaces: int = 1


class Hello(NamedTuple):
    job: int
    token: str
    rank: int  # -1 for another rack's server
    num_workers: int
    lane: int  # -1: discovery only
    shard: Tuple[int, int]  # (this server's index, number of shards)
    rdma: Optional[dict]
    peer_rack: Optional[int]  # set on a link between rack servers ...
    core: Optional[int]  # ... with the core it is for ...
    interface: Optional[int] = None  # ... and the interface (the same index on both servers)


def hello(body: dict, limits: Limits) -> Hello:
    """A HELLO, from a worker (job, token, rank, num_workers, lane, shard, shards, rdma) or from
    another rack's server (job, token, peer_rack, core, interface)."""
    extra = sorted(str(k)[:40] for k in body if k not in _HELLO_FIELDS)
    if extra:
        raise ProtocolError(f"HELLO has unknown field(s) {extra[:5]}")
    job = _integer("HELLO", "job", body.get("job"), 0, MAX_ID)
    if job not in limits.job_ids:
        raise ProtocolError(f"job {job} is not registered on this server")
    token = _string("HELLO", "token", body.get("token", ""), MAX_TOKEN)
    if "peer_rack" in body:
        rack = _integer("HELLO", "peer_rack", body["peer_rack"], 0, limits.racks - 1)
        core = _integer("HELLO", "core", body.get("core"), 0, limits.cores - 1)
        interface = _integer("HELLO", "interface", body.get("interface"), 0, limits.interfaces - 1)
        return Hello(job, token, -1, 0, 0, (0, 1), None, rack, core, interface)
    rank = _integer("HELLO", "rank", body.get("rank"), 0, MAX_WORKERS - 1)
    num_workers = _integer("HELLO", "num_workers", body.get("num_workers"), 1, MAX_WORKERS)
    shards = _integer("HELLO", "shards", body.get("shards", 1), 1, MAX_SHARDS)
    shard = _integer("HELLO", "shard", body.get("shard", 0), 0, shards - 1)
    # a lane is one (shard, interface, core, connection): the job's own count is checked by the core
    lane = _integer("HELLO", "lane", body.get("lane"), -1, MAX_SHARDS * 4096 - 1)
    rdma = _object("HELLO", "rdma", body["rdma"]) if "rdma" in body else None
    return Hello(job, token, rank, num_workers, lane, (shard, shards), rdma, None, None)


class Register(NamedTuple):
    batch: int
    arrays: List[Tuple[Hashable, int]]  # (key, elements)
    cost: int  # bytes counted against the job's budget
    rdma: Optional[dict]


def register(body: dict, limits: Limits, budget_left: int) -> Register:
    """A REGISTER: {batch, arrays: [[key, elements], ...], rdma?}; the batch must fit in what is
    left of the job's budget (`budget_left` bytes; a batch registered before costs nothing again,
    the caller passes the budget accordingly)."""
    batch = _integer("REGISTER", "batch", body.get("batch"), 0, MAX_ID)
    arrays = body.get("arrays")
    if not isinstance(arrays, list) or not 1 <= len(arrays) <= MAX_ARRAYS:
        raise ProtocolError(f"REGISTER.arrays must be a list of 1..{MAX_ARRAYS} [key, elements] pairs, "
                            f"got {_show(arrays)}")
    chunk_elems = max(1, limits.chunk_bytes // 4)
    checked, cost = [], 0
    for i, item in enumerate(arrays):
        if not isinstance(item, list) or len(item) != 2:
            raise ProtocolError(f"REGISTER.arrays[{i}] must be a [key, elements] pair, got {_show(item)}")
        key, elements = item
        if isinstance(key, str):
            _string("REGISTER", f"arrays[{i}] key", key, MAX_KEY)
        else:
            _integer("REGISTER", f"arrays[{i}] key", key, -2**63, 2**63 - 1)
        _integer("REGISTER", f"arrays[{i}] elements", elements, 1, limits.max_job_bytes // 4)
        cost += 4 * elements + CHUNK_OVERHEAD * -(-elements // chunk_elems)
        if cost > budget_left:
            raise ProtocolError(f"REGISTER.arrays: batch {batch} needs more than the {budget_left} bytes left of "
                                f"the job's {limits.max_job_bytes}-byte budget (server option --max-job-bytes)")
        checked.append((key, elements))
    rdma = _object("REGISTER", "rdma", body["rdma"]) if "rdma" in body else None
    return Register(batch, checked, cost, rdma)


def optimizer(body: dict) -> Optimizer:
    """An OPTIMIZER: {name, parameters...}, as `Optimizer.to_dict` writes it."""
    name = _string("OPTIMIZER", "name", body.get("name"), 64)
    cls = OPTIMIZERS.get(name)
    if cls is None:
        raise ProtocolError(f"OPTIMIZER.name {name[:40]!r} is not one of {sorted(OPTIMIZERS)}")
    types: Dict[str, type] = {f.name: f.type for f in fields(cls)}
    for key, value in body.items():
        if key == "name":
            continue
        if key not in types:
            raise ProtocolError(f"OPTIMIZER {name!r} has no parameter {str(key)[:40]!r}")
        if types[key] in (bool, "bool"):
            if not isinstance(value, bool):
                raise ProtocolError(f"OPTIMIZER.{key} must be true or false, got {_show(value)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, int) and abs(value) > 2**53) or not math.isfinite(value):
            raise ProtocolError(f"OPTIMIZER.{key} must be a finite number, got {_show(value)}")
    try:
        return optimizer_from_dict(body)
    except ConfigError as exc:
        raise ProtocolError(f"OPTIMIZER: {exc}") from None


def error_message(body: dict) -> str:
    """An ERROR: {message}. A peer that gives up is believed; only its text is bounded."""
    message = body.get("message", "")
    if not isinstance(message, str):
        raise ProtocolError(f"ERROR.message must be a string, got {_show(message)}")
    return message[:MAX_MESSAGE]


MAX_SHARE_NAME = 256  # characters of a SHARE's name


def share(body: dict) -> Tuple[str, object]:
    """A SHARE: {name, value}; the value is any JSON (the frame's size bounds it)."""
    name = _string("SHARE", "name", body.get("name"), MAX_SHARE_NAME)
    if not name:
        raise ProtocolError("SHARE.name must not be empty")
    if "value" not in body:
        raise ProtocolError("SHARE has no value")
    return name, body["value"]


def ready(body: dict) -> int:
    """A READY (server -> worker): {batch, rdma?}; the batch."""
    return _integer("READY", "batch", body.get("batch"), 0, MAX_ID)


def peer_ready(body: dict) -> int:
    """A PEER_READY (between rack servers): {batch}."""
    return _integer("PEER_READY", "batch", body.get("batch"), 0, MAX_ID)
