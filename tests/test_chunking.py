"""Tests for phub.reduction.chunking: chunk sizes, greedy lane balancing (checked against its bound and
step by step), determinism across processes, the lane layout, argument checks, and the real
model layouts in experiments/data/layouts."""
import csv
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from phub.reduction.chunking import DEFAULT_CHUNK_BYTES, ITEMSIZE, ChunkPlan, Topology
from phub.errors import ConfigError

LAYOUTS = Path(__file__).resolve().parent.parent / "experiments" / "data" / "layouts"
REPO = LAYOUTS.parent.parent


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def model_arrays(model):
    """(name, shape) of every array of a model, in layout order; shapes like '64x3x7x7'."""
    return [(r["name"], tuple(int(d) for d in r["shape"].split("x"))) for r in read_csv(LAYOUTS / f"{model}.csv")]


MODELS = read_csv(LAYOUTS / "models.csv")


def random_batches(rng, nbatches):
    batches, n = [], 0
    for _ in range(nbatches):
        batch = []
        for _ in range(rng.randint(1, 12)):
            shape = tuple(rng.choice([1, 2, 3, 7, 16, 31, 64]) for _ in range(rng.randint(1, 3)))
            batch.append((f"k{n}", shape))
            n += 1
        batches.append(batch)
    return batches


def random_topology(rng):
    return Topology(rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 3))


def recomputed_loads(plan):
    loads = [0] * plan.topology.lanes
    for chunk in plan.chunks:
        loads[chunk.lane] += chunk.size * ITEMSIZE
    return loads


# ------------------------------------------------------------------------------------------------
# Balance


def assert_balanced(plan):
    loads = recomputed_loads(plan)
    assert loads == plan.lane_loads
    largest = max(c.nbytes for c in plan.chunks)
    total = sum(c.nbytes for c in plan.chunks)
    assert max(loads) - min(loads) <= largest, (loads, largest)
    assert max(loads) <= math.ceil(total / len(loads)) + largest, (loads, largest)


@pytest.mark.parametrize("seed", range(150))
def test_balance_within_one_chunk_for_random_layouts_and_incremental_batches(seed):
    rng = random.Random(seed)
    plan = ChunkPlan(random_topology(rng), chunk_bytes=ITEMSIZE * rng.randint(8, 256))
    for batch in random_batches(rng, rng.randint(1, 5)):
        loads_before = list(plan.lane_loads)
        new = plan.add_arrays(batch)
        assert_balanced(plan)  # after every batch, not only at the end
        # Greedy, replayed: largest first (ties by id), each chunk onto a least-loaded lane.
        loads = loads_before
        for chunk in sorted(new, key=lambda c: (-c.size, c.id)):
            assert loads[chunk.lane] == min(loads), (chunk, loads)
            loads[chunk.lane] += chunk.nbytes
        assert loads == plan.lane_loads


@pytest.mark.parametrize("model", [m["model"] for m in MODELS])
def test_real_layouts_chunk_counts_and_balance(model):
    expected = next(m for m in MODELS if m["model"] == model)
    rows = read_csv(LAYOUTS / f"{model}.csv")
    arrays = model_arrays(model)
    for row, (_, shape) in zip(rows, arrays):
        assert math.prod(shape) == int(row["elements"]), row
    assert len(arrays) == int(expected["arrays"])
    plan = ChunkPlan(Topology(interfaces=2, cores=5, lanes_per_pair=2))
    plan.add_arrays(arrays)
    assert len(plan.chunks) == int(expected["chunks_32k"])
    assert sum(c.size for c in plan.chunks) == sum(int(r["elements"]) for r in rows)
    assert_balanced(plan)


# ------------------------------------------------------------------------------------------------
# Chunk sizes and coverage


@pytest.mark.parametrize(
    "shape, sizes",
    [
        ((1,), [1]),
        (1, [1]),
        ((8192,), [8192]),
        ((2, 8192), [8192, 8192]),  # exact multiple: no empty tail chunk
        ((8193,), [8192, 1]),  # chunk + 1
        ((3, 7, 7), [147]),
        (8192 * 3 + 5, [8192, 8192, 8192, 5]),
    ],
)
def test_chunk_sizes_at_32k(shape, sizes):
    assert DEFAULT_CHUNK_BYTES == 32 * 1024
    plan = ChunkPlan(Topology())
    plan.add_arrays([("w", shape)])
    assert [c.size for c in plan.key_chunks("w")] == sizes
    assert [c.offset for c in plan.key_chunks("w")] == [8192 * i for i in range(len(sizes))]
    assert plan.chunk_nbytes() == [4 * s for s in sizes]
    assert plan.key_size("w") == sum(sizes)


def test_chunk_bytes_is_configurable():
    plan = ChunkPlan(Topology(), chunk_bytes=40)
    plan.add_arrays([("a", (25,)), ("b", (10,)), ("c", (30,))])
    assert [c.size for c in plan.chunks] == [10, 10, 5, 10, 10, 10, 10]
    assert [c.key for c in plan.chunks] == ["a", "a", "a", "b", "c", "c", "c"]


@pytest.mark.parametrize("seed", range(40))
def test_key_chunks_cover_each_array_exactly_once_in_order(seed):
    rng = random.Random(1000 + seed)
    plan = ChunkPlan(random_topology(rng), chunk_bytes=ITEMSIZE * rng.randint(8, 64))
    batches = random_batches(rng, rng.randint(1, 4))
    registered = []
    for b, batch in enumerate(batches):
        new = plan.add_arrays(batch)
        assert [c.batch for c in new] == [b] * len(new)
        assert [c.key for c in new] == [k for k, _ in batch for c in plan.key_chunks(k)]
        registered += batch
    assert [c.id for c in plan.chunks] == list(range(len(plan.chunks)))
    seen = []
    for key, shape in registered:
        chunks = plan.key_chunks(key)
        assert plan.has_key(key) and plan.key_size(key) == math.prod(shape)
        assert [c.id for c in chunks] == list(range(chunks[0].id, chunks[0].id + len(chunks)))
        position = 0
        for chunk in chunks:
            assert chunk.key == key and chunk.offset == position and chunk.size >= 1
            position += chunk.size
        assert position == math.prod(shape)  # no gap, no overlap, nothing past the end
        assert all(c.size == plan.chunk_elems for c in chunks[:-1])
        seen += [c.id for c in chunks]
    assert sorted(seen) == list(range(len(plan.chunks)))
    for lane in range(plan.topology.lanes):
        assert plan.lane_chunks(lane) == [c for c in plan.chunks if c.lane == lane]


# ------------------------------------------------------------------------------------------------
# Determinism: identical plans from identical sequences, in this process and in another one

BUILD_SRC = '''
import hashlib, json, random
from phub.reduction.chunking import ChunkPlan, Topology
def build_digest():
    rng = random.Random(7)
    plan = ChunkPlan(Topology(interfaces=3, cores=4, lanes_per_pair=2), chunk_bytes=4096)
    for b in range(4):
        plan.add_arrays([(("layer", b, i) if i % 2 else f"w{b}.{i}", (rng.randint(1, 3000),))
                         for i in range(rng.randint(1, 30))])
    rows = [[c.id, repr(c.key), c.offset, c.size, c.lane, c.batch] for c in plan.chunks]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()
'''


def build_digest():
    namespace = {}
    exec(BUILD_SRC, namespace)
    return namespace["build_digest"]()


def test_same_sequence_gives_identical_plans():
    for seed in range(20):
        plans = []
        for _ in range(2):
            rng = random.Random(seed)
            plan = ChunkPlan(random_topology(rng), chunk_bytes=ITEMSIZE * rng.randint(8, 100))
            for batch in random_batches(rng, 3):
                plan.add_arrays(batch)
            plans.append(plan)
        assert plans[0].chunks == plans[1].chunks
        assert plans[0].lane_loads == plans[1].lane_loads
        assert [ChunkPlan.batch_digest(b) for b in plans[0].batches] == [
            ChunkPlan.batch_digest(b) for b in plans[1].batches
        ]


def test_plan_built_in_another_process_is_identical():
    here = build_digest()
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="12345")
    code = BUILD_SRC + "\nprint(build_digest())\n"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == here


def test_batch_digest_tells_batches_apart():
    digest = ChunkPlan.batch_digest
    assert digest([("a", 3), ("b", 4)]) == digest([("a", 3), ("b", 4)])
    assert digest([("a", 3), ("b", 4)]) != digest([("b", 4), ("a", 3)])
    assert digest([("a", 3)]) != digest([("a", 4)])


# ------------------------------------------------------------------------------------------------
# Lane layout


@pytest.mark.parametrize("interfaces, cores, per_pair", [(1, 1, 1), (2, 3, 1), (4, 2, 3), (3, 5, 2), (1, 7, 2)])
def test_every_interface_and_core_carries_the_same_number_of_lanes(interfaces, cores, per_pair):
    topo = Topology(interfaces, cores, per_pair)
    assert topo.lanes == interfaces * cores * per_pair
    lanes = range(topo.lanes)
    pairs = Counter((topo.lane_interface(lane), topo.lane_core(lane)) for lane in lanes)
    assert pairs == {(i, c): per_pair for i in range(interfaces) for c in range(cores)}
    assert Counter(topo.lane_interface(lane) for lane in lanes) == {i: cores * per_pair for i in range(interfaces)}
    assert Counter(topo.lane_core(lane) for lane in lanes) == {c: interfaces * per_pair for c in range(cores)}
    for core in range(cores):
        assert topo.core_lanes(core) == [lane for lane in lanes if topo.lane_core(lane) == core]


# ------------------------------------------------------------------------------------------------
# Rejections


@pytest.mark.parametrize("field", ["interfaces", "cores", "lanes_per_pair"])
@pytest.mark.parametrize("value", [0, -1, 1.0, True, "2", None])
def test_topology_rejects_non_positive_integers(field, value):
    with pytest.raises(ConfigError, match=f"Topology.{field}"):
        Topology(**{field: value})


@pytest.mark.parametrize("chunk_bytes", [0, 6, 2, -4, 32768.0, "32768", True, None])
def test_bad_chunk_bytes_rejected(chunk_bytes):
    with pytest.raises(ConfigError, match="chunk_bytes"):
        ChunkPlan(Topology(), chunk_bytes=chunk_bytes)


def test_smallest_chunk_bytes_accepted():
    plan = ChunkPlan(Topology(2, 1), chunk_bytes=4)
    plan.add_arrays([("a", 3)])
    assert [c.size for c in plan.chunks] == [1, 1, 1]


@pytest.mark.parametrize(
    "shape, message",
    [((), "0-d"), ((0,), "no elements"), ((3, 0), "no elements"), (0, "no elements"),
     ((-1,), "invalid shape"), ((2.0,), "invalid shape")],
)
def test_bad_shapes_rejected_and_plan_unchanged(shape, message):
    plan = ChunkPlan(Topology(2, 2))
    plan.add_arrays([("first", (10,))])
    before = (list(plan.chunks), list(plan.lane_loads), len(plan.batches))
    with pytest.raises(ConfigError, match=message) as info:
        plan.add_arrays([("good", (5,)), ("bad", shape)])
    assert "'bad'" in str(info.value)
    assert (plan.chunks, plan.lane_loads, len(plan.batches)) == before
    assert not plan.has_key("good") and not plan.has_key("bad")


def test_empty_batch_rejected():
    with pytest.raises(ConfigError, match="at least one array"):
        ChunkPlan(Topology()).add_arrays([])


def test_duplicate_keys_rejected_within_and_across_batches():
    plan = ChunkPlan(Topology())
    with pytest.raises(ConfigError, match="'a' is registered twice"):
        plan.add_arrays([("a", 1), ("b", 2), ("a", 3)])
    assert plan.chunks == [] and not plan.has_key("b")
    plan.add_arrays([("a", 1)])
    with pytest.raises(ConfigError, match="'a' is registered twice"):
        plan.add_arrays([("c", 2), ("a", 1)])
    assert [c.key for c in plan.chunks] == ["a"] and not plan.has_key("c")


def test_unknown_key_names_the_key():
    plan = ChunkPlan(Topology())
    plan.add_arrays([("known", 4)])
    assert not plan.has_key("conv9_weight")
    with pytest.raises(ConfigError, match="'conv9_weight'"):
        plan.key_chunks("conv9_weight")
    with pytest.raises(ConfigError, match="'conv9_weight'"):
        plan.key_size("conv9_weight")
