"""Jobs laid out beyond one server: shards on every worker (PShard) and one PBox per rack with
two-phase reduction. Real `phub server` processes and workers on loopback addresses."""
import json
import sys

import numpy as np
import pytest

import phub
from phub.cluster import loopback
from phub.launch import run_job
from conftest import WORKER
from test_exchange import SIZES, aggregate, assert_close, nag_oracle
from workers.exchange_worker import SHARED_EARLY, SHARED_LATE, initial

STEPS = 3


def run(tmp_path, cluster, workers, optimizer, cores=1, transport="tcp", share=False):
    params = {"sizes": SIZES, "steps": STEPS, "optimizer": optimizer and optimizer.to_dict(), "out_dir": str(tmp_path),
              "share": share}
    config = phub.ServerConfig(cores=cores, timeout=60, transport=transport)
    result = run_job([sys.executable, WORKER], workers, config, cluster, extra_env={"PHUB_TEST": json.dumps(params)})
    assert result.status == 0, result.failed
    return [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(workers)]


@pytest.mark.parametrize("racks, workers, cores", [(2, 4, 1), (2, 2, 2), (3, 3, 1)])
def test_two_phase_reduction_matches_the_oracle_bit_identically_across_racks(tmp_path, racks, workers, cores):
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=1.0 / workers)
    results = run(tmp_path, loopback(workers, racks=racks), workers, opt, cores)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        want = nag_oracle(workers, i, size, STEPS, 0.1, 0.9, 1e-2, 1.0 / workers)
        for rank, saved in enumerate(results):
            # rank 0's initial values reached every rack, although each rack's first worker pushed its own
            assert np.array_equal(saved[f"init{i}"].reshape(-1), initial(size, i)), f"rank {rank}: init {i}"
            assert_close(saved[f"final{i}"].reshape(-1), want, f"rank {rank}, array {i}")
            assert np.array_equal(saved[f"final{i}"], results[0][f"final{i}"]), f"rank {rank} differs from rank 0"


def test_two_phase_aggregation_only_sums_every_rack(tmp_path):
    results = run(tmp_path, loopback(4, racks=2), 4, None)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        for step in range(1, STEPS + 1):
            want = aggregate(4, step, i, size).astype(np.float32)
            for saved in results:
                assert np.array_equal(saved[f"sum{step}_{i}"].reshape(-1), want)


def test_sharded_servers_on_every_worker(tmp_path):
    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=0.0, rescale_grad=1.0 / 3)
    results = run(tmp_path, loopback(3, shards=3), 3, opt, cores=2)
    for i, shape in enumerate(SIZES):
        size = int(np.prod(shape))
        want = nag_oracle(3, i, size, STEPS, 0.1, 0.9, 0.0, 1.0 / 3)
        for saved in results:
            assert_close(saved[f"final{i}"].reshape(-1), want, f"array {i}")


@pytest.mark.parametrize("layout", ["racks", "shards"])
def test_rank_0_shares_with_every_rack_and_through_sharded_servers(tmp_path, layout):
    """A SHARE goes to rank 0's server (lane 0's core), which hands it to its workers and, with
    two-phase reduction, to the other racks' servers for theirs."""
    cluster = loopback(4, racks=2) if layout == "racks" else loopback(3, shards=3)
    workers = len(cluster.workers)
    results = run(tmp_path, cluster, workers, phub.NAG(learning_rate=0.1, rescale_grad=1.0 / workers), cores=2,
                  share=True)
    for saved in results:
        assert json.loads(str(saved["shared"])) == [SHARED_EARLY, SHARED_LATE]
