"""The round contract between the C loops (phub/_fastpath.c and its headers) and Python.

The C loops take the common case of a round off the interpreter, on Python's own objects: they
read and write a chunk's round state in its `ChunkState`, read the job's tables, the optimizer's
parameters and the worker's awaited results, and build tuples that Python unpacks. This module
is where those fields are listed and handed to the C side, once, at import:

- the C side names the fields it needs (`contract_fields` in phub/_fastpath_contract.h,
  `phub._fastpath.contract_fields()` from Python);
- each field's owner declares where it lives (a class's `__slots__`, or a record's field names
  in order: `FAST_TABLE_COLUMNS` and the like, beside the code that builds the record);
- `register()` hands those layouts (`layouts()`) to `phub._fastpath.register_contract`, which
  looks every field up by name and keeps its slot offset or position in one C table that the
  loops read. A missing field (renamed, removed) or one not usable as the loops use it raises
  `ContractError` naming it, at import, instead of the loops reading the wrong memory.

So a renamed slot or a reordered tuple needs no change in C: the positions follow the layout,
and only a field the C side no longer finds is an error. The records the C side *builds*
("local round", "rack total") are the exception: Python unpacks them positionally, so their
layout must be the order C builds them in, and any other order is a ContractError.

Every field the C side reads (r) or writes (w):

  record         field           type                           C   owner: where it is declared / built
  ChunkState     chunk           chunking.Chunk                 r   aggregation.ChunkState.__slots__ (read in place)
  ChunkState     rounds          int                            rw  aggregation.ChunkState.__slots__
  ChunkState     arrived         int                            rw  aggregation.ChunkState.__slots__
  ChunkState     mask            int (bit r: rank r's copy in)  rw  aggregation.ChunkState.__slots__
  ChunkState     slots           list of float32 arrays         r   aggregation.ChunkState.__slots__
  ChunkState     acc             float32 array                  r   aggregation.ChunkState.__slots__ (C writes into it)
  ChunkState     mom             float32 array or None          r   aggregation.ChunkState.__slots__ (C writes into it)
  ChunkState     weight          float32 array                  r   aggregation.ChunkState.__slots__ (C writes into it)
  ChunkState     weight_view     memoryview of weight           r   aggregation.ChunkState.__slots__
  ChunkState     result_view     memoryview                     r   aggregation.ChunkState.__slots__
  Chunk          id              int                            r   chunking.Chunk (a dataclass field, by name)
  Handle         _arrived        method(count)                  r   handle.Handle (called once per run of results)
  loop params    kind            int (optim.LOOP_NAG/LOOP_SGD)  r   optim.LOOP_PARAMS_FIELDS, Optimizer.loop_params()
  loop params    needs_momentum  bool                           r   optim.LOOP_PARAMS_FIELDS
  loop params    learning_rate   float                          r   optim.LOOP_PARAMS_FIELDS
  loop params    momentum        float                          r   optim.LOOP_PARAMS_FIELDS
  loop params    wd              float                          r   optim.LOOP_PARAMS_FIELDS
  loop params    rescale_grad    float                          r   optim.LOOP_PARAMS_FIELDS
  loop params    clip_gradient   float                          r   optim.LOOP_PARAMS_FIELDS
  expect entry   destination     writable bytes (memoryview)    r   protocol.worker.EXPECT_ENTRY_FIELDS, expect_entry()
  expect entry   awaited         list (the "awaited" record)    r   protocol.worker.EXPECT_ENTRY_FIELDS
  awaited        iteration       int                            r   protocol.worker.AWAITED_FIELDS, awaited_by()
  awaited        handle          Handle                         r   protocol.worker.AWAITED_FIELDS
  fast_table     lane            int32 (-1: another core's)     r   aggregation.FAST_TABLE_COLUMNS
  fast_table     nbytes          int32                          r   aggregation.FAST_TABLE_COLUMNS
  fast_table     ready           int32 (0/1)                    r   aggregation.FAST_TABLE_COLUMNS
  chunk_table    lane            int32                          r   protocol.worker.CHUNK_TABLE_COLUMNS
  chunk_table    nbytes          int32                          r   protocol.worker.CHUNK_TABLE_COLUMNS
  rack_table     owner           int64 (-1: another core's)     r   hierarchy.RACK_TABLE_COLUMNS
  rack_table     arrived         int64 (a bit per rack)         rw  hierarchy.RACK_TABLE_COLUMNS
  rack_table     interface       int64                          r   hierarchy.RACK_TABLE_COLUMNS
  local round    state           ChunkState                     w   LOCAL_ROUND_FIELDS here: drain_pushes builds
  local round    acc             float32 buffer                 w     it; protocol.core and rack_rounds_done read
  local round    last            float32 buffer or None         w     it (`last` may view the staging buffer)
  rack total     state           ChunkState                     w   RACK_TOTAL_FIELDS here: the rack loops build
  rack total     total           float32 row                    w     it; protocol.core unpacks it

The tables are JobState.fast_table, WorkerProtocol.chunk_table and HierarchicalJobState.rack_table.
The arguments of each loop (tables, lists, dicts) are in its docstring; the wire format is
phub/protocol/wire.py's. tests/test_fastpath_contract.py checks that this table lists exactly the fields
of `contract_fields()`, that the real classes register, and that a renamed field is refused.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..reduction.aggregation import FAST_TABLE_COLUMNS, ChunkState
from ..reduction.chunking import Chunk
from ..client.handle import Handle
from ..reduction.hierarchy import RACK_TABLE_COLUMNS
from ..reduction.optim import LOOP_PARAMS_FIELDS
from ..protocol.worker import AWAITED_FIELDS, CHUNK_TABLE_COLUMNS, EXPECT_ENTRY_FIELDS

try:
    from .. import _fastpath as fastpath
except ImportError:  # not built: every frame takes the Python path
    fastpath = None

# The records the C loops build, in the order they build them (see the module docstring).
LOCAL_ROUND_FIELDS = ("state", "acc", "last")
RACK_TOTAL_FIELDS = ("state", "total")


class _NotBuilt(LookupError):
    """Stands for phub._fastpath.ContractError where the extension is not built."""


ContractError = fastpath.ContractError if fastpath is not None else _NotBuilt


def layouts() -> dict:
    """Where each record the C loops use keeps its fields: record -> class or field names."""
    return {
        "ChunkState": ChunkState,
        "Chunk": tuple(field.name for field in dataclasses.fields(Chunk)),
        "Handle": Handle,
        "loop params": LOOP_PARAMS_FIELDS,
        "expect entry": EXPECT_ENTRY_FIELDS,
        "awaited": AWAITED_FIELDS,
        "fast_table": FAST_TABLE_COLUMNS,
        "chunk_table": CHUNK_TABLE_COLUMNS,
        "rack_table": RACK_TABLE_COLUMNS,
        "local round": LOCAL_ROUND_FIELDS,
        "rack total": RACK_TOTAL_FIELDS,
    }


def register(given: Optional[dict] = None) -> None:
    """Hand `given` (default: `layouts()`) to the C loops, which look up every field they use in
    it. Raises ContractError naming the first field they cannot find or use; nothing to do
    where phub._fastpath is not built."""
    if fastpath is not None:
        fastpath.register_contract(layouts() if given is None else given)


register()
