"""The control-message validators (phub/protocol/messages.py), fed JSON objects directly: no sockets.

Every bad field is a ProtocolError naming the message and the field; arbitrary JSON never raises
anything else."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phub.protocol import messages
from phub.errors import ProtocolError
from phub.reduction.optim import NAG, SGD

LIMITS = messages.Limits(frozenset({0, 1}), cores=2, racks=2, chunk_bytes=32768, max_job_bytes=1 << 24, interfaces=2)
HELLO = {"job": 1, "token": "t", "rank": 0, "num_workers": 2, "lane": 0, "shard": 0, "shards": 1}

json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=20)
    | st.integers(-2**70, 2**70) | st.sampled_from([10**10, 10**12, 150000000, 2**32, -1, 0]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=8)


def test_a_valid_hello_and_its_defaults():
    hello = messages.hello(HELLO, LIMITS)
    assert (hello.job, hello.rank, hello.lane, hello.shard, hello.peer_rack) == (1, 0, 0, (0, 1), None)
    rack = messages.hello({"job": 0, "token": "", "peer_rack": 1, "core": 1, "interface": 1}, LIMITS)
    assert (rack.peer_rack, rack.core, rack.interface) == (1, 1, 1)


@pytest.mark.parametrize("interface, words", [
    (None, "HELLO.interface must be an integer, got None"),  # a rack's link says which interface it is
    (2, "HELLO.interface = 2 is outside [0, 1]"),
    ("0", "HELLO.interface must be an integer, got '0'"),
])
def test_a_rack_hello_names_a_known_interface(interface, words):
    body = {"job": 0, "token": "", "peer_rack": 1, "core": 1}
    if interface is not None:
        body["interface"] = interface
    with pytest.raises(ProtocolError, match=words.replace("[", r"\[").replace("]", r"\]")):
        messages.hello(body, LIMITS)


@pytest.mark.parametrize("field, value, words", [
    ("job", [1], "HELLO.job must be an integer"),
    ("job", 7, "job 7 is not registered"),
    ("lane", [0], "HELLO.lane must be an integer"),
    ("shards", 10**12, "HELLO.shards"),
    ("shards", 150000000, "HELLO.shards"),
    ("shard", 1, "HELLO.shard = 1 is outside [0, 0]"),
    ("rank", True, "HELLO.rank must be an integer"),
    ("token", {"a": 1}, "HELLO.token must be a string"),
    ("token", "x" * 5000, "HELLO.token is 5000 characters"),
    ("num_workers", 0, "HELLO.num_workers = 0"),
    ("rdma", [1, 2], "HELLO.rdma must be a JSON object"),
    ("peer_rack", 2, "HELLO.peer_rack = 2 is outside [0, 1]"),
    ("extra", 1, "unknown field"),
])
def test_each_bad_hello_field_is_named(field, value, words):
    with pytest.raises(ProtocolError, match=words.replace("[", r"\[").replace("]", r"\]")):
        messages.hello({**HELLO, field: value}, LIMITS)


@pytest.mark.parametrize("arrays, words", [
    ([["w", float("inf")]], "arrays[0] elements must be an integer"),
    ([["w", 10**10]], "arrays[0] elements = 10000000000 is outside"),
    ([["w", 0]], "arrays[0] elements = 0"),
    ([[["k"], 4]], "arrays[0] key must be an integer"),
    ([["w", 4, 5]], "arrays[0] must be a [key, elements] pair"),
    ([], "REGISTER.arrays must be a list of 1.."),
    ("w", "REGISTER.arrays must be a list"),
    ([["a", 1 << 21], ["b", 1 << 21]], "budget"),  # 16 MiB in all: over the 16 MiB budget with bookkeeping
])
def test_each_bad_register_field_is_named(arrays, words):
    with pytest.raises(ProtocolError) as info:
        messages.register({"batch": 0, "arrays": arrays}, LIMITS, LIMITS.max_job_bytes)
    assert words in str(info.value)


def test_register_counts_values_and_chunk_bookkeeping_against_the_budget():
    reg = messages.register({"batch": 0, "arrays": [["w", 8192], [3, 1]]}, LIMITS, LIMITS.max_job_bytes)
    assert reg.arrays == [("w", 8192), (3, 1)]
    assert reg.cost == 4 * 8193 + 2 * messages.CHUNK_OVERHEAD
    with pytest.raises(ProtocolError, match="bytes left"):
        messages.register({"batch": 1, "arrays": [["v", 8192]]}, LIMITS, 4 * 8192 + messages.CHUNK_OVERHEAD - 1)


@pytest.mark.parametrize("body, words", [
    ({"name": ["nag"]}, "OPTIMIZER.name must be a string"),
    ({"name": "adam"}, "OPTIMIZER.name 'adam' is not one of"),
    ({"name": "nag", "learning_rate": 10**400}, "OPTIMIZER.learning_rate must be a finite number"),
    ({"name": "nag", "momentum": float("nan")}, "OPTIMIZER.momentum must be a finite number"),
    ({"name": "sgd", "lr": 1}, "has no parameter 'lr'"),
    ({"name": "aggregate", "average": 1}, "OPTIMIZER.average must be true or false"),
    ({"name": "nag", "learning_rate": -1}, "learning_rate must be >= 0"),
])
def test_each_bad_optimizer_field_is_named(body, words):
    with pytest.raises(ProtocolError, match=words.replace("(", r"\(")):
        messages.optimizer(body)


def test_valid_optimizers_round_trip():
    for opt in (NAG(0.1, 0.9, 1e-4), SGD(0.5)):
        assert messages.optimizer(json.loads(json.dumps(opt.to_dict()))) == opt


def _only_protocol_errors(call):
    try:
        call()
    except ProtocolError as exc:
        assert str(exc)
        assert len(str(exc)) < 600  # a huge value is described, not printed


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(messages._HELLO_FIELDS)), json_values, st.booleans())
def test_arbitrary_hello_fields_raise_only_protocol_errors(field, value, rack):
    base = {"job": 0, "token": "", "peer_rack": 0, "core": 0, "interface": 0} if rack else dict(HELLO)
    _only_protocol_errors(lambda: messages.hello({**base, field: value}, LIMITS))


@settings(max_examples=300, deadline=None)
@given(json_values, st.lists(st.tuples(json_values, json_values), max_size=4), json_values)
def test_arbitrary_registers_raise_only_protocol_errors(batch, pairs, arrays):
    _only_protocol_errors(lambda: messages.register({"batch": batch, "arrays": [list(p) for p in pairs]},
                                                    LIMITS, LIMITS.max_job_bytes))
    _only_protocol_errors(lambda: messages.register({"batch": 0, "arrays": arrays}, LIMITS, 1 << 20))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["nag", "sgd", "aggregate"]) | json_values,
       st.dictionaries(st.sampled_from(["learning_rate", "momentum", "wd", "average", "x"]), json_values))
def test_arbitrary_optimizers_raise_only_protocol_errors(name, params):
    _only_protocol_errors(lambda: messages.optimizer({"name": name, **params}))


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_error_and_peer_ready_bodies(value):
    _only_protocol_errors(lambda: messages.error_message({"message": value}))
    _only_protocol_errors(lambda: messages.peer_ready({"batch": value}))
