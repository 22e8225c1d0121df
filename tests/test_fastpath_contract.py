"""The round contract (phub/network/fastpath_contract.py, phub/_fastpath_contract.h): the C loops reach
every Python field they use through one table, filled by name at import. A field the C side
reads that Python renames or drops must be refused at registration, naming it; a reordered
record Python builds must be followed; a reordered record C builds must be refused."""
import importlib
import re

import numpy as np
import pytest

from phub.protocol import wire
from phub.reduction.aggregation import ChunkState
from phub.reduction.optim import LOOP_PARAMS_FIELDS, NAG
from phub.protocol import worker

fastpath = pytest.importorskip("phub._fastpath", reason="the C extension phub._fastpath is not built")
contract = importlib.import_module("phub.network.fastpath_contract")

FIELDS = fastpath.contract_fields()  # (record, field, type, how)


@pytest.fixture
def registered():
    """The real registration, restored after the test (whatever the test registered)."""
    contract.register()
    before = fastpath.registered_contract()
    yield before
    contract.register()
    assert fastpath.registered_contract() == before


def without(record: str, field: str) -> dict:
    """The real layouts, but `record` lacks `field` (renamed to `field` + "_renamed")."""
    layouts = contract.layouts()
    layout = layouts[record]
    if isinstance(layout, tuple):
        layouts[record] = tuple(name + "_renamed" if name == field else name for name in layout)
    elif record == "ChunkState":
        slots = tuple(name + "_renamed" if name == field else name for name in ChunkState.__slots__)
        layouts[record] = type("RenamedState", (), {"__slots__": slots})
    else:  # a class whose method the loops call
        layouts[record] = type("Renamed" + record, (), {})
    return layouts


def test_the_real_classes_register_cleanly_and_the_positions_are_pythons(registered):
    found = registered
    assert {(record, field) for record, field, _, _ in FIELDS} <= set(found)
    assert found["expect entry", "destination"] == worker.DESTINATION
    assert found["expect entry", "awaited"] == worker.AWAITED
    assert found["awaited", "iteration"] == worker.ITERATION and found["awaited", "handle"] == worker.HANDLE
    assert [found["loop params", name] for name in LOOP_PARAMS_FIELDS] == list(range(len(LOOP_PARAMS_FIELDS)))
    assert found["fast_table", "<width>"] == 3 and found["rack_table", "<width>"] == 3
    assert found["chunk_table", "<width>"] == 2


@pytest.mark.parametrize("record, field", [(record, field) for record, field, _, _ in FIELDS])
def test_a_field_the_c_side_uses_that_python_renamed_is_refused_naming_it(registered, record, field):
    with pytest.raises(contract.ContractError) as error:
        contract.register(without(record, field))
    message = str(error.value)
    assert field in message and record in message
    assert fastpath.registered_contract() == registered  # a refused registration changes nothing


def test_a_chunk_state_whose_field_is_not_a_writable_slot_is_refused(registered):
    plain = type("Plain", (), dict.fromkeys(ChunkState.__slots__))  # every name, none of them a slot
    with pytest.raises(contract.ContractError, match=r"Plain\.chunk is not a writable __slots__ attribute"):
        contract.register({**contract.layouts(), "ChunkState": plain})
    with pytest.raises(contract.ContractError, match="must be its class"):
        contract.register({**contract.layouts(), "ChunkState": ChunkState.__slots__})
    with pytest.raises(contract.ContractError, match="no layout for the fast_table"):
        contract.register({name: layout for name, layout in contract.layouts().items() if name != "fast_table"})


def test_a_record_the_c_side_builds_must_keep_the_order_it_builds(registered):
    for record, order in (("local round", ("acc", "state", "last")), ("rack total", ("total", "state"))):
        with pytest.raises(contract.ContractError, match=f"builds the {record} with 'state' at position 0"):
            contract.register({**contract.layouts(), record: order})


def result_frame(cid: int, values, iteration: int) -> bytes:
    data = np.asarray(values, np.float32).tobytes()
    return wire.pack_header(wire.Kind.RESULT, 0, wire.SERVER_SENDER, cid, iteration, len(data)) + data


class Told:
    """A handle double: what it was told arrived."""

    def __init__(self):
        self.count = 0

    def _arrived(self, count=1):
        self.count += count


def test_a_reordered_record_python_builds_is_read_where_its_layout_says(registered):
    """With the expect entry, the awaited list and the chunk table all reversed, drain_results
    still finds the destination, the iteration, the handle, the lane and the length."""
    contract.register({**contract.layouts(), "expect entry": ("awaited", "destination"),
                       "awaited": ("handle", "iteration"), "chunk_table": ("nbytes", "lane")})
    found = fastpath.registered_contract()
    assert (found["expect entry", "destination"], found["awaited", "iteration"]) == (1, 1)
    out = np.zeros(2, np.float32)
    handle = Told()
    expect = {0: ([handle, 3], memoryview(out).cast("B"))}
    table = np.array([[8, 0]], dtype=np.int32)  # (nbytes, lane)
    staging = bytearray(result_frame(0, [1.5, 2.5], iteration=3))
    assert fastpath.drain_results(staging, 0, len(staging), 0, 0, table, expect) == (len(staging), False)
    assert out.tolist() == [1.5, 2.5] and handle.count == 1 and expect == {}


def test_registration_at_import_names_the_missing_field(monkeypatch, registered):
    """phub.network.fastpath_contract registers when imported: a layout that lost a field the C side
    reads fails that import with ContractError naming the field, not a crash later."""
    monkeypatch.setattr(worker, "AWAITED_FIELDS", ("iteration", "waiter"))
    with pytest.raises(contract.ContractError, match="field 'handle' .* of the awaited"):
        importlib.reload(contract)
    monkeypatch.undo()
    importlib.reload(contract)


def test_what_python_builds_puts_each_field_where_its_layout_says():
    handle = Told()
    awaited = worker.awaited_by(7, handle)
    entry = worker.expect_entry(b"dest", awaited)
    assert entry[worker.DESTINATION] == b"dest" and worker.entry_handle(entry) is handle
    assert awaited[worker.ITERATION] == 7
    nag = NAG(learning_rate=0.25, momentum=0.5, wd=0.125, rescale_grad=2.0, clip_gradient=3.0)
    params = dict(zip(LOOP_PARAMS_FIELDS, nag.loop_params()))
    assert params == {"kind": nag.loop_kind, "needs_momentum": True, "learning_rate": 0.25, "momentum": 0.5,
                      "wd": 0.125, "rescale_grad": 2.0, "clip_gradient": 3.0}


def documented_fields() -> set:
    """The (record, field) rows of the table in phub/network/fastpath_contract.py's docstring."""
    records = sorted({record for record, _, _, _ in FIELDS}, key=len, reverse=True)
    pattern = re.compile(rf"^  ({'|'.join(map(re.escape, records))})\s+(\w+)\s", re.M)
    return set(pattern.findall(contract.__doc__))


def test_the_contract_docstring_lists_exactly_the_fields_the_c_side_uses():
    assert documented_fields() == {(record, field) for record, field, _, _ in FIELDS}
