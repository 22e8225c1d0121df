"""Faithful baselines: on the grid's scaled-down models every system spreads a model over its
server links as it would at the paper's scale (experiments.placement; DESIGN.md, "Validity of a
scaled-down rerun"). Pure computation: no process starts."""
import dataclasses
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from experiments.layouts import MODELS
from experiments.models import load_model, scaled
from experiments.network import loopback_cluster
from experiments.placement import gloo_ring_sends, mxnet_key_parts, placement
from experiments.systems import SYSTEMS, get_system
from phub.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
import points  # noqa: E402
from run_shape import options_for  # noqa: E402

CONFIGS = ["config/config.yaml", "config/quick.yaml"]
# Each endpoint's share of the model's bytes may differ from the paper's by this much (absolute,
# 0.2% of the model): scaling rounds every array to whole elements (tiny ones up to one), which
# moves a share by well under that (at most 0.07% on the grids today).
SHARE_TOLERANCE = 0.002


def settings_of(point, scale, chunk_bytes):
    """The system's `describe` of the point's run (what its result row records), on a cluster
    whose extra carries `scale` as the emulated rack's does (None: the paper's, unscaled)."""
    options = dataclasses.replace(options_for(point), chunk_bytes=chunk_bytes)
    if point["system"] != "phub":  # racks matter to phub only (a PBox per rack); the others see one flat rack
        options = dataclasses.replace(options, racks=1)
    cluster = loopback_cluster(point["system"], point["workers"], options)
    cluster = dataclasses.replace(cluster, extra={"scale": scale} if scale else {})
    return tuple(sorted(get_system(point["system"]).describe(cluster, options).items()))


@dataclasses.dataclass(frozen=True)
class Setup:
    system: str
    workers: int
    s_m: float
    ours: tuple  # the run's describe items at s_m
    papers: tuple  # the same run's at the paper's scale: s_m = 1, the paper-equivalent chunk
    models: tuple  # the nine, but the chunk sweep's own model for its sizes (the sweep runs no other)

    def __str__(self):
        shown = {k: v for k, v in self.ours if k in ("servers", "interfaces", "chunk_bytes", "bigarray_bound")}
        return f"{self.system}-n{self.workers}-sm{self.s_m:g}-" + "-".join(f"{k}{v}" for k, v in shown.items())


def scaled_points():
    """(point, scale as its rack records it) of every scaled point of the grids, from points.py."""
    for name in CONFIGS:
        for p in points.points(yaml.safe_load((ROOT / name).read_text())):
            if "rack" in p:  # not calibration: loopback, unscaled
                scale = dict(p["rack"]["scale"])
                yield p, dict(scale, time=scale["model"] / scale["network"])


def grid_setups():
    """Every distinct setup (system, settings, s_m) of the grids' scaled points."""
    seen = {}
    for p, scale in scaled_points():
        paper_chunk = 4 * round(p["chunk_bytes_paper"] / 4)  # whole float32 elements
        models = (p["model"],) if p["experiment"] == "chunk_sweep" else MODELS
        setup = Setup(p["system"], p["workers"], scale["model"], settings_of(p, scale, p["chunk_bytes"]),
                      settings_of(p, None, paper_chunk), models)
        key = (setup.system, setup.s_m, _inputs(setup, setup.ours), _inputs(setup, setup.papers))
        if key not in seen or len(models) > len(seen[key].models):
            seen[key] = setup
    return list(seen.values())


def _inputs(setup, settings):
    """What of a setup decides its placement (experiments.placement), to take each one once."""
    settings = dict(settings)
    if setup.system == "gloo-ring":
        return setup.workers
    if setup.system.startswith("pslite"):
        return settings["servers"], settings["bigarray_bound"]
    return (settings["servers"] // settings["racks"], settings["interfaces"], settings["cores"],
            settings["lanes_per_pair"], settings["chunk_bytes"])


SETUPS = grid_setups()


@lru_cache(maxsize=None)
def elements(model, s_m):
    """The model's array sizes as a rack with s_m holds them (None: the paper's)."""
    loaded = load_model(model)
    if s_m is not None:
        loaded = scaled(loaded, {"model": s_m, "time": 1.0})
    return [a.elements for a in loaded.arrays]


@lru_cache(maxsize=None)
def placed(system, model, s_m, settings, workers):
    """`placement` of the model scaled by s_m (None: the paper's), cached: setups share settings."""
    return placement(system, elements(model, s_m), dict(settings), workers)


def test_the_grids_cover_every_system_and_the_papers_server_counts():
    assert {setup.system for setup in SETUPS} == set(SYSTEMS)
    servers = {(setup.system, dict(setup.ours)["servers"]) for setup in SETUPS}
    assert {("pslite-shard", 8), ("pshard", 8), ("pslite-central", 1)} <= servers  # the paper's 8 workers
    assert any(setup.system == "phub" and dict(setup.ours)["interfaces"] == 8 for setup in SETUPS)


@pytest.mark.parametrize("setup", SETUPS, ids=str)
def test_each_server_link_carries_the_papers_share_of_every_model(setup):
    """At the setup's s_m, every model's arrays are split over the same servers as at s_m = 1 with
    the same servers (the paper's setup where the grid has 8 workers), and each server link's share
    of the bytes is the paper's within SHARE_TOLERANCE. The paper's chunk is the point's
    paper-equivalent one (chunk_bytes_paper, in whole float32 elements). Every model of the nine,
    but the chunk sweep's sizes with the sweep's model only."""
    for model in setup.models:
        here = placed(setup.system, model, setup.s_m, setup.ours, setup.workers)
        there = placed(setup.system, model, None, setup.papers, setup.workers)
        assert here.split_keys == there.split_keys, (model, sorted(here.split_keys ^ there.split_keys))
        gap = max(abs(a - b) for a, b in zip(here.shares, there.shares))
        assert len(here.shares) == len(there.shares) and gap <= SHARE_TOLERANCE, (model, gap)
        if setup.system.startswith("pslite"):  # one ps-lite message per (key, server) part
            assert here.messages == there.messages, model


@pytest.mark.parametrize("s_m,bound", [(1, 1000 * 1000), (66.666667, 15000), (100, 10000), (373.333333, 2679)])
def test_the_run_tells_mxnet_the_big_array_bound_divided_by_s_m(s_m, bound):
    point = {"system": "pslite-shard", "workers": 8, "compute": "zero", "network": "emulated", "cores": 1,
             "interfaces": 8, "racks": 1, "chunk_bytes": 8192}
    described = dict(settings_of(point, {"network": 1, "model": s_m, "time": 1} if s_m != 1 else None, 8192))
    assert described["bigarray_bound"] == bound and described["bigarray_bound_paper"] == 1000 * 1000


def test_a_pslite_point_records_the_bound_its_run_uses_in_its_measurement():
    checked = 0
    for p, scale in scaled_points():
        if p["system"].startswith("pslite"):
            assert p["bigarray_bound"] == dict(settings_of(p, scale, p["chunk_bytes"]))["bigarray_bound"], p["id"]
            checked += 1
        else:
            assert "bigarray_bound" not in p, p["id"]
    assert checked


def test_mxnet_places_keys_as_its_kvstore_does():
    # below the bound: whole, to server (key * 9973) mod servers
    assert mxnet_key_parts(5, 999, 3, 1000) == [(5 * 9973 % 3, 999)]
    # at the bound: one part per server, cut at C's round() of n / S * i (2.5 -> 3, 7.5 -> 8)
    assert mxnet_key_parts(0, 10, 4, 10) == [(0, 3), (1, 2), (2, 3), (3, 2)]
    shares = placement("pslite-shard", [10, 9, 7], {"servers": 4, "bigarray_bound": 10}, 4)
    assert shares.split_keys == {0} and shares.messages == 6
    assert shares.endpoint_bytes == (4 * 3, 4 * (2 + 9), 4 * (3 + 7), 4 * 2)  # 9973 % 4 = 1, 2 * 9973 % 4 = 2


def test_gloo_ring_sends_each_rank_its_part_of_both_phases():
    # 64 bytes over 2 ranks: 4 segments of 16 B, each rank sends 2 per phase: 2 (N-1) / N of the bytes
    ring = gloo_ring_sends(64, 2)
    assert ring.endpoint_bytes == (64, 64) and ring.messages == 4
    # a 3 MiB gradient over 4 ranks: 8 segments of 384 KiB (at least 2 per rank), 6 sends per phase
    ring = gloo_ring_sends(3 << 20, 4)
    assert ring.endpoint_bytes == (2 * 3 * (3 << 20) // 4,) * 4 and ring.messages == 12


def test_placement_refuses_a_missing_setting_naming_it():
    with pytest.raises(ConfigError, match="bigarray_bound"):
        placement("pslite-shard", [10], {"servers": 2}, 2)
    with pytest.raises(ConfigError, match="unknown system"):
        placement("mpi", [10], {}, 2)
